#include "experiment/experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/error.h"
#include "experiment/churn.h"
#include "experiment/fault.h"
#include "codec/codec.h"
#include "common/random.h"
#include "engine/evaluator.h"
#include "engine/in_process_link.h"
#include "engine/member_round.h"
#include "engine/replica.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

namespace starling {

namespace {

using Clock = std::chrono::steady_clock;

// What one replica did in one round.
struct RoundRecord {
    int steps = 0;  // inner steps it trained in the round
    int group = 0;  // replicas whose values entered its outer step, itself included (1: solo)
    size_t sent = 0;
    size_t received = 0;
    int refused = 0;
    double train_loss = NAN;
    double val_loss = NAN;
};

// The speeds as one CSV field: "1 1 3", or "" when all are 1.
std::string speeds_text(const ExperimentConfig& config) {
    std::string text;
    for (const double speed : config.speeds)
        text += (text.empty() ? "" : " ") + fmt::format("{}", speed);
    return text;
}

uint64_t hash_of(std::span<const float> values) {
    return XXH3_64bits(values.data(), values.size_bytes());
}

class ExperimentRun {
public:
    explicit ExperimentRun(const ExperimentConfig& config);
    ExperimentSummary execute();

private:
    std::vector<Replica*> live_replicas();
    bool faulty(int index) const {
        return config_.fault.kind != FaultKind::None &&
               index >= config_.replicas - config_.fault.members;
    }
    // The learning rates a replica trains with: a faulty one's under a learning_rate fault.
    const LrSchedule& schedule_of(const Replica& r) const {
        return faulty(r.index()) ? faulty_schedule_ : schedule_;
    }
    // The link replica r runs its round over: the board's, altered by a message fault.
    std::unique_ptr<RoundLink> link_of(Replica& r);
    // The round's judgements of messages (InProcessBoard::take_judgements) into the summary.
    void tally_judgements();
    void apply_churn(int64_t round);
    // H inner steps; with overlapped rounds the pending outer step lands after overlap_steps.
    // Returns the mean training loss.
    double inner_phase_landing_outer_step(Replica& r);
    // Each live replica's inner steps this round, by the round budget and the speeds, into
    // records_; returns the simulated time the round takes (the slowest replica's steps over its
    // speed).
    double plan_steps(const std::vector<Replica*>& live);
    // The method's exchange and outer step for every live replica at once, each on a thread of its
    // own over the in-process board (engine/in_process_link.h): the round starlingd runs.
    void exchange_round(int64_t round, const std::vector<Replica*>& live);
    // DiLoCo: every live replica must hold the same phi and momentum after the outer step.
    void check_diloco_agreement(int64_t round, const std::vector<Replica*>& live) const;
    double spread();
    void evaluate_live();
    void write_rows(int64_t round, double sigma, float lr);
    void log_round(int64_t round, double sigma, float lr);
    void finish_summary();
    void append_summary_line() const;

    const ExperimentConfig& config_;
    Backend backend_;
    std::vector<std::unique_ptr<Replica>> replicas_;
    std::vector<std::unique_ptr<DataLoader>> ddp_streams_;
    std::unique_ptr<Evaluator> evaluator_;
    std::optional<ChurnSchedule> churn_;
    LrSchedule schedule_, faulty_schedule_;
    std::string garbage_dir_;                // what a garbage_data fault's replicas read
    std::vector<FaultMemory> fault_memory_;  // by replica
    std::vector<std::unique_ptr<MemberRound>> member_rounds_;  // one per replica (noloco, diloco)
    InProcessBoard board_;
    std::vector<float> mean_;  // the final averaged phi
    std::vector<RoundRecord> records_;
    // Overlapped rounds: where each replica restarted (the solo step's phi, engine/overlap.h)
    // while the outer step its message fed waits to land, whether one waits, and the solo step's
    // momentum, dropped.
    std::vector<std::vector<float>> overlap_start_;
    std::vector<bool> landing_;
    std::vector<float> solo_momentum_;
    std::ofstream csv_;
    ExperimentSummary summary_;
    uint64_t live_replica_rounds_ = 0;
    double total_sent_ = 0.0, total_received_ = 0.0;
    double sim_time_ = 0.0;  // simulated time so far, in steps at speed 1
    Clock::time_point start_;
};

ExperimentRun::ExperimentRun(const ExperimentConfig& config)
    : config_(config),
      schedule_(config.train.lr_schedule()),
      faulty_schedule_(faulty_train_config(config.fault, config.train).lr_schedule()) {
    config_.validate();
    backend_ = make_backend({config_.train.device, config_.train.threads, config_.train.matmul});
    spdlog::info("device {}: {}", config_.train.device, backend_.description);
    if (config_.fault.kind == FaultKind::GarbageData) {
        garbage_dir_ =
            (std::filesystem::path(config_.out_dir) / (config_.name + "-garbage-data")).string();
        write_garbage_data(config_.train, garbage_dir_);
    }
    // Data-parallel training keeps one model, fed by every replica's stream each step.
    const int models = config_.method == OuterMethod::Ddp ? 1 : config_.replicas;
    for (int i = 0; i < config_.replicas; i++) {
        const uint64_t node_id = hash_index(config_.train.seed, static_cast<uint64_t>(i) + 1);
        if (i < models) {
            const TrainConfig train =
                faulty(i) ? faulty_train_config(config_.fault, config_.train, garbage_dir_)
                          : config_.train;
            replicas_.push_back(
                std::make_unique<Replica>(train, config_.replicas, backend_, i, node_id));
        }
        if (config_.method == OuterMethod::Ddp) {
            ddp_streams_.push_back(make_train_loader(config_.train, config_.replicas, i, node_id));
        }
    }
    evaluator_ = std::make_unique<Evaluator>(config_.train, backend_);
    if (config_.churn.enabled && models > 1) {
        churn_.emplace(config_.churn, models, config_.inner_steps);
    }
    if (config_.method == OuterMethod::NoLoCo || config_.method == OuterMethod::DiLoCo)
        for (size_t i = 0; i < replicas_.size(); i++)
            member_rounds_.push_back(
                std::make_unique<MemberRound>(config_, replicas_[0]->manifest()));
    const size_t n = replicas_[0]->size();
    mean_.resize(n);
    records_.resize(replicas_.size());
    if (config_.overlap_steps > 0) {
        overlap_start_.assign(replicas_.size(), std::vector<float>(n));
        solo_momentum_.resize(n);
    }
    landing_.assign(replicas_.size(), false);
    fault_memory_.resize(replicas_.size());
    if (config_.fault.kind != FaultKind::None)
        spdlog::info("experiment {}: the last {} replica(s) faulty: {} (scale {})", config_.name,
                     config_.fault.members, fault_kind_name(config_.fault.kind),
                     config_.fault.scale);

    std::filesystem::create_directories(config_.out_dir);
    const std::filesystem::path csv_path =
        std::filesystem::path(config_.out_dir) / (config_.name + ".csv");
    csv_.open(csv_path);
    if (!csv_) throw Error("cannot write " + csv_path.string());
    csv_ << "round,inner_step,replica,node_id,live,group,val_loss,train_loss,sigma_w,lr,"
            "bytes_sent,bytes_received,refused,seconds,steps,sim_time\n";

    summary_.name = config_.name;
    summary_.method = config_.method;
    summary_.params = n;
    summary_.rounds = config_.rounds();
    spdlog::info(
        "experiment {}: {} x {} replicas, {} parameters, {} rounds of {} inner steps{}, "
        "{} validation batches, {} threads",
        config_.name, outer_method_name(config_.method), config_.replicas, n, summary_.rounds,
        config_.inner_steps,
        config_.overlap_steps > 0
            ? fmt::format(" (outer steps land {} inner steps late)", config_.overlap_steps)
            : std::string(),
        evaluator_->batches(), cpu_threads());
    if (const std::string warning = config_.settings_warning(); !warning.empty())
        spdlog::warn("experiment {}: {}", config_.name, warning);
}

std::vector<Replica*> ExperimentRun::live_replicas() {
    std::vector<Replica*> live;
    for (auto& r : replicas_) {
        if (r->live) live.push_back(r.get());
    }
    return live;
}

void ExperimentRun::apply_churn(int64_t round) {
    std::vector<bool> live;
    for (auto& r : replicas_) live.push_back(r->live);
    const ChurnSchedule::Changes changes = churn_->at_round(round, live);
    for (int i : changes.leaving) replicas_[i]->live = false;
    std::vector<int> sponsors;
    for (auto& r : replicas_) {
        if (r->live) sponsors.push_back(r->index());
    }
    for (int i : changes.returning) {
        Replica& joiner = *replicas_[i];
        const Replica& sponsor = *replicas_[churn_->pick_sponsor(sponsors)];
        joiner.rejoin_from(sponsor, hash_index(joiner.node_id(), static_cast<uint64_t>(round)));
        landing_[i] = false;  // it starts from the sponsor's phi: no step of its own waits
        joiner.live = true;
        records_[i].received += joiner.snapshot_bytes();
        summary_.rejoins++;
    }
    if (!changes.leaving.empty() || !changes.returning.empty()) {
        spdlog::info("round {}: {} replica(s) left, {} came back from a sponsor's snapshot", round,
                     changes.leaving.size(), changes.returning.size());
    }
}

void ExperimentRun::exchange_round(int64_t round, const std::vector<Replica*>& live) {
    std::vector<uint64_t> ids;
    for (Replica* r : live) ids.push_back(r->node_id());
    board_.begin_round(static_cast<uint64_t>(round), ids, static_cast<size_t>(config_.group_size));
    const uint64_t tokens_per_step =
        static_cast<uint64_t>(config_.train.batch_size) * config_.train.effective_seq_len();
    std::vector<std::future<RoundOutcome>> running;
    for (Replica* r : live) {
        running.push_back(std::async(std::launch::async, [&, r] {
            // Every replica's round at once: one thread each codes and steps.
            set_cpu_threads(1);
            const codec::SerialCoding serial;
            const std::unique_ptr<RoundLink> link = link_of(*r);
            const int steps = records_[r->index()].steps;
            const uint64_t tokens =
                config_.token_weighting ? tokens_per_step * static_cast<uint64_t>(steps) : 0;
            try {
                return member_rounds_[r->index()]->step(*link, *r, static_cast<uint64_t>(round),
                                                        r->theta(), tokens);
            } catch (...) {
                board_.abandon(r->node_id());
                throw;
            }
        }));
    }
    std::vector<RoundOutcome> outcomes;
    for (auto& outcome : running) outcome.wait();
    set_cpu_threads(config_.train.threads);
    for (auto& outcome : running) outcomes.push_back(outcome.get());
    for (size_t k = 0; k < live.size(); k++) {
        const RoundOutcome& outcome = outcomes[k];
        RoundRecord& record = records_[live[k]->index()];
        record.group = outcome.members;
        record.sent += outcome.bytes_sent;
        record.received += outcome.bytes_received;
        record.refused = static_cast<int>(outcome.refused);
        if (outcome.refused > 0)
            spdlog::warn("round {}: replica {} refused {}", round, live[k]->index(),
                         outcome.failure);
    }
    tally_judgements();
    if (config_.method == OuterMethod::DiLoCo) check_diloco_agreement(round, live);
}

std::unique_ptr<RoundLink> ExperimentRun::link_of(Replica& r) {
    std::unique_ptr<RoundLink> link = board_.link(r.node_id());
    if (!faulty(r.index()) || !fault_alters_messages(config_.fault.kind)) return link;
    const uint64_t self = r.node_id();
    PartnerMessage partner_message = [this, self](uint64_t round, uint64_t partner, uint32_t part) {
        const bool honest = std::any_of(replicas_.begin(), replicas_.end(), [&](const auto& other) {
            return other->node_id() == partner && !faulty(other->index());
        });
        return honest ? board_.sent(round, partner, self, part) : nullptr;
    };
    return std::make_unique<FaultyLink>(std::move(link), config_.fault, config_, r.manifest(),
                                        r.node_id(), r.phi(), fault_memory_[r.index()],
                                        std::move(partner_message));
}

void ExperimentRun::tally_judgements() {
    std::map<uint64_t, bool> faulty_by_id;
    for (const auto& r : replicas_) faulty_by_id[r->node_id()] = faulty(r->index());
    for (const InProcessBoard::Judgement& j : board_.take_judgements()) {
        if (faulty_by_id[j.judge]) continue;  // what faulty members make of others says nothing
        const bool poisoned = faulty_by_id[j.member];
        (poisoned ? summary_.poisoned_judged : summary_.honest_judged)++;
        if (j.refused) (poisoned ? summary_.poisoned_refused : summary_.honest_refused)++;
        if (j.quarantined && poisoned && summary_.first_quarantine_round < 0)
            summary_.first_quarantine_round = static_cast<int64_t>(j.round);
    }
}

void ExperimentRun::check_diloco_agreement(int64_t round, const std::vector<Replica*>& live) const {
    // A faulty member steps with its own D, which the others did not get.
    std::vector<Replica*> quorum;
    for (Replica* r : live)
        if (!faulty(r->index()) || !fault_alters_messages(config_.fault.kind)) quorum.push_back(r);
    std::sort(quorum.begin(), quorum.end(),
              [](Replica* a, Replica* b) { return a->node_id() < b->node_id(); });
    const uint64_t phi_hash = hash_of(quorum[0]->phi());
    const uint64_t momentum_hash = hash_of(quorum[0]->momentum());
    for (Replica* r : quorum) {
        if (hash_of(r->phi()) != phi_hash || hash_of(r->momentum()) != momentum_hash) {
            throw Error("DiLoCo round " + std::to_string(round) + ": replica " +
                        std::to_string(r->index()) + " disagrees with replica " +
                        std::to_string(quorum[0]->index()) + " after the outer step");
        }
    }
}

// sigma_w = sqrt(mean over live replicas and parameters of (phi_i - mean phi)^2), in double so
// that replicas holding the same bits give exactly zero.
double ExperimentRun::spread() {
    const std::vector<Replica*> live = live_replicas();
    if (live.size() < 2) return 0.0;
    const size_t n = live[0]->size();
    const double count = static_cast<double>(live.size());
    double sum = 0.0;
    for (size_t k = 0; k < n; k++) {
        double mean = 0.0;
        for (Replica* r : live) mean += r->phi()[k];
        mean /= count;
        for (Replica* r : live) {
            const double d = r->phi()[k] - mean;
            sum += d * d;
        }
    }
    return std::sqrt(sum / (count * static_cast<double>(n)));
}

void ExperimentRun::evaluate_live() {
    for (Replica* r : live_replicas()) records_[r->index()].val_loss = evaluator_->loss(r->phi());
}

void ExperimentRun::write_rows(int64_t round, double sigma, float lr) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    auto number = [](double v) { return std::isfinite(v) ? fmt::format("{:.6f}", v) : ""; };
    for (auto& r : replicas_) {
        const RoundRecord& rec = records_[r->index()];
        csv_ << round << ',' << round * config_.inner_steps << ',' << r->index() << ','
             << fmt::format("{:016x}", r->node_id()) << ',' << (r->live ? 1 : 0) << ',' << rec.group
             << ',' << number(rec.val_loss) << ',' << number(rec.train_loss) << ','
             << fmt::format("{:.6e}", sigma) << ',' << fmt::format("{:.6e}", lr) << ',' << rec.sent
             << ',' << rec.received << ',' << rec.refused << ',' << fmt::format("{:.2f}", seconds)
             << ',' << rec.steps << ',' << fmt::format("{:.2f}", sim_time_) << '\n';
    }
    csv_.flush();
}

void ExperimentRun::log_round(int64_t round, double sigma, float lr) {
    double lo = INFINITY, hi = -INFINITY, sum = 0.0, train = 0.0, sent = 0.0;
    int n = 0, paired = 0;
    for (Replica* r : live_replicas()) {
        const RoundRecord& rec = records_[r->index()];
        train += rec.train_loss;
        sent += static_cast<double>(rec.sent);
        paired += rec.group >= 2 ? 1 : 0;
        if (std::isfinite(rec.val_loss)) {
            lo = std::min(lo, rec.val_loss);
            hi = std::max(hi, rec.val_loss);
            sum += rec.val_loss;
            n++;
        }
    }
    const size_t live = live_replicas().size();
    const std::string val =
        n ? fmt::format("val {:.4f} [{:.4f}, {:.4f}]", sum / n, lo, hi) : std::string("val -");
    spdlog::info(
        "round {:>4}/{} | step {:>6} | lr {:.2e} | train {:.4f} | {} | spread {:.3e} | "
        "live {} paired {} | sent {:.2f} MB",
        round, summary_.rounds, round * config_.inner_steps, lr, train / live, val, sigma, live,
        paired, sent / 1e6);
}

ExperimentSummary ExperimentRun::execute() {
    start_ = Clock::now();
    evaluate_live();
    write_rows(0, 0.0, schedule_.lr_at(0));
    const int H = config_.inner_steps;
    const uint64_t tokens_per_step =
        static_cast<uint64_t>(config_.train.batch_size) * config_.train.effective_seq_len();
    const size_t n = summary_.params;
    for (int64_t round = 0; round < summary_.rounds; round++) {
        records_.assign(replicas_.size(), RoundRecord{});
        if (churn_) apply_churn(round);
        std::vector<Replica*> live = live_replicas();
        sim_time_ += plan_steps(live);
        uint64_t steps_taken = 0;
        for (Replica* r : live) {
            RoundRecord& record = records_[r->index()];
            if (config_.method == OuterMethod::Ddp) {
                record.train_loss = r->averaged_gradient_phase(H, schedule_, ddp_streams_);
            } else if (config_.round_budget == RoundBudget::Tokens) {
                record.train_loss = r->inner_phase(record.steps, schedule_of(*r), H);
            } else {
                record.train_loss = inner_phase_landing_outer_step(*r);
            }
            steps_taken += static_cast<uint64_t>(record.steps);
        }
        summary_.tokens += tokens_per_step * steps_taken *
                           (config_.method == OuterMethod::Ddp ? config_.replicas : 1);
        // Overlapped: where each replica trains from while its exchange would run, taken before
        // the exchange steps phi.
        if (!member_rounds_.empty()) {
            for (Replica* r : live) {
                MemberRound& member = *member_rounds_[r->index()];
                member.prepare(*r);
                if (config_.overlap_steps > 0)
                    member.overlapped_start(*r, r->theta(), overlap_start_[r->index()],
                                            solo_momentum_);
            }
        }
        switch (config_.method) {
            case OuterMethod::Ddp: {
                // A ring all-reduce of fp32 gradients every step: 2 (N-1)/N of the gradient out
                // and in per node. Computed, not sent: nothing crosses a wire here.
                const double N = config_.replicas;
                const size_t bytes = static_cast<size_t>(2.0 * (N - 1) / N * 4.0 * n) * H;
                records_[0] = RoundRecord{H, int(N), bytes, bytes, 0, records_[0].train_loss, NAN};
                live[0]->adopt_theta();
                break;
            }
            case OuterMethod::Local:
                for (Replica* r : live) {
                    records_[r->index()].group = 1;
                    r->adopt_theta();
                }
                break;
            case OuterMethod::DiLoCo:
            case OuterMethod::NoLoCo: exchange_round(round, live); break;
        }
        for (Replica* r : live) {
            if (config_.overlap_steps == 0) {
                r->restart_from_phi(config_.residual_in_weights());
            } else {
                r->restart_from(overlap_start_[r->index()]);
                landing_[r->index()] = true;
            }
        }
        const int64_t done = round + 1;
        if (done % config_.eval_every == 0 || done == summary_.rounds) evaluate_live();
        const double sigma = spread();
        const float lr = schedule_.lr_at(done * H - 1);
        write_rows(done, sigma, lr);
        log_round(done, sigma, lr);
        for (Replica* r : live) {
            const RoundRecord& rec = records_[r->index()];
            live_replica_rounds_++;
            total_sent_ += static_cast<double>(rec.sent);
            total_received_ += static_cast<double>(rec.received);
            (rec.group >= 2 ? summary_.paired : summary_.solo)++;
            summary_.refused += static_cast<uint64_t>(rec.refused);
        }
        summary_.final_spread = sigma;
    }
    finish_summary();
    append_summary_line();
    return summary_;
}

double ExperimentRun::plan_steps(const std::vector<Replica*>& live) {
    const int H = config_.inner_steps;
    double total_speed = 0.0, slowest = INFINITY;
    for (Replica* r : live) {
        total_speed += config_.speed(r->index());
        slowest = std::min(slowest, config_.speed(r->index()));
    }
    // Data-parallel steps wait for every replica's batch, the one model standing for them all.
    if (config_.method == OuterMethod::Ddp)
        for (int i = 0; i < config_.replicas; i++) slowest = std::min(slowest, config_.speed(i));
    if (config_.round_budget == RoundBudget::Steps) {
        for (Replica* r : live) records_[r->index()].steps = H;
        return H / slowest;
    }
    // The round's batches, live replicas x H, shared by speed: each replica trains about as long
    // as the others, and the round ends when the last one is done.
    const double batches = static_cast<double>(live.size()) * H;
    double longest = 0.0;
    for (Replica* r : live) {
        const double speed = config_.speed(r->index());
        const int steps = std::max(1, static_cast<int>(std::lround(batches * speed / total_speed)));
        records_[r->index()].steps = steps;
        longest = std::max(longest, steps / speed);
    }
    return longest;
}

double ExperimentRun::inner_phase_landing_outer_step(Replica& r) {
    const int H = config_.inner_steps;
    const int late = config_.overlap_steps;
    const LrSchedule& schedule = schedule_of(r);
    if (!landing_[r.index()]) return r.inner_phase(H, schedule);
    const double before = r.inner_phase(late, schedule);
    r.rebase_onto_phi(overlap_start_[r.index()], config_.residual_in_weights());
    landing_[r.index()] = false;
    if (late == H) return before;
    return (before * late + r.inner_phase(H - late, schedule) * (H - late)) / H;
}

void ExperimentRun::finish_summary() {
    std::vector<std::span<const float>> phis;
    double sum = 0.0, honest_sum = 0.0;
    int honest = 0;
    summary_.final_loss_min = INFINITY;
    summary_.final_loss_max = -INFINITY;
    for (Replica* r : live_replicas()) {
        const double loss = records_[r->index()].val_loss;
        sum += loss;
        summary_.final_loss_min = std::min(summary_.final_loss_min, loss);
        summary_.final_loss_max = std::max(summary_.final_loss_max, loss);
        phis.push_back(r->phi());
        if (!faulty(r->index())) {
            honest_sum += loss;
            honest++;
        }
    }
    summary_.final_loss_mean = sum / static_cast<double>(phis.size());
    summary_.honest_loss_mean = honest > 0 ? honest_sum / honest : NAN;
    group_mean(mean_, phis);
    summary_.averaged_phi_loss = evaluator_->loss(mean_);
    if (live_replica_rounds_ > 0) {
        summary_.sent_per_round = total_sent_ / static_cast<double>(live_replica_rounds_);
        summary_.received_per_round = total_received_ / static_cast<double>(live_replica_rounds_);
    }
    summary_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    summary_.sim_time = sim_time_;
    spdlog::info(
        "{}: final val loss {:.4f} (min {:.4f}, max {:.4f}), perplexity {:.3f}, averaged "
        "phi {:.4f}, spread {:.3e}, {:.3f} bytes/param sent per round, {} paired / {} "
        "solo replica-rounds, {} refused, {} rejoins, {:.0f} s",
        summary_.name, summary_.final_loss_mean, summary_.final_loss_min, summary_.final_loss_max,
        std::exp(summary_.final_loss_mean), summary_.averaged_phi_loss, summary_.final_spread,
        summary_.sent_per_round / static_cast<double>(summary_.params), summary_.paired,
        summary_.solo, summary_.refused, summary_.rejoins, summary_.seconds);
    if (config_.fault.kind != FaultKind::None)
        spdlog::info(
            "{}: honest replicas' final val loss {:.4f}; faulty members' messages refused {} of "
            "{}, honest members' {} of {}; first quarantine of a faulty member in round {}",
            summary_.name, summary_.honest_loss_mean, summary_.poisoned_refused,
            summary_.poisoned_judged, summary_.honest_refused, summary_.honest_judged,
            summary_.first_quarantine_round);
}

// One line per run in <out_dir>/summary.csv, with the settings that distinguish runs.
void ExperimentRun::append_summary_line() const {
    const std::filesystem::path path = std::filesystem::path(config_.out_dir) / "summary.csv";
    const bool fresh = !std::filesystem::exists(path);
    std::ofstream out(path, std::ios::app);
    if (!out) throw Error("cannot append to " + path.string());
    if (fresh) {
        out << "name,method,replicas,inner_steps,seed,params,rounds,tokens,final_loss_mean,"
               "final_loss_min,final_loss_max,final_ppl,averaged_phi_loss,final_sigma_w,"
               "sent_per_round,received_per_round,sent_bytes_per_param,paired,solo,refused,"
               "rejoins,seconds,mode,state_codec,delta_codec,error_feedback,momentum,outer_lr,"
               "pull,form,churn,round_budget,token_weighting,speeds,sim_time,fault,faulty,"
               "fault_scale,honest_loss_mean,poisoned_judged,poisoned_refused,honest_judged,"
               "honest_refused,first_quarantine_round,defences,topk_density,topk_value_bits,"
               "feedback_decay,residual_in_weights\n";
    }
    const ExperimentSummary& s = summary_;
    const ExchangeConfig& x = config_.exchange;
    out << fmt::format(
        "{},{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.4f},{:.6f},{:.6e},{:.0f},{:.0f},{:.4f},"
        "{},{},{},{},{:.1f},{},{},{},{},{},{},{},{},{},{},{},{},{:.1f},{},{},{},{:.6f},{},{},{},{},"
        "{},{},{},{},{},{}\n",
        s.name, outer_method_name(s.method), config_.replicas, config_.inner_steps,
        config_.train.seed, s.params, s.rounds, s.tokens, s.final_loss_mean, s.final_loss_min,
        s.final_loss_max, std::exp(s.final_loss_mean), s.averaged_phi_loss, s.final_spread,
        s.sent_per_round, s.received_per_round, s.sent_per_round / static_cast<double>(s.params),
        s.paired, s.solo, s.refused, s.rejoins, s.seconds, message_mode_name(x.mode),
        codec::codec_name(x.state_codec), codec::codec_name(x.delta_codec),
        x.error_feedback ? 1 : 0, config_.outer.momentum, config_.outer.lr, config_.outer.pull,
        momentum_form_name(config_.outer.form), config_.churn.enabled ? 1 : 0,
        round_budget_name(config_.round_budget), config_.token_weighting ? 1 : 0,
        speeds_text(config_), s.sim_time, fault_kind_name(config_.fault.kind),
        config_.fault.kind == FaultKind::None ? 0 : config_.fault.members, config_.fault.scale,
        s.honest_loss_mean, s.poisoned_judged, s.poisoned_refused, s.honest_judged,
        s.honest_refused, s.first_quarantine_round, config_.judge_messages ? 1 : 0, x.topk_density,
        x.topk_value_bits, config_.delta_feedback_decay(), config_.residual_in_weights() ? 1 : 0);
}

}  // namespace

ExperimentSummary run_experiment(const ExperimentConfig& config) {
    ExperimentRun run(config);
    return run.execute();
}

}  // namespace starling
