// One node's replica: its engine (theta is the model's parameter arena, trained by AdamW on one
// device or, data-parallel, on several GPUs of one box: engine/device_group.h), its own
// disjoint stream of the training data, and the outer state of docs/spec.md section 1:
// phi, the outer momentum and the error-feedback residual. The experiment runs many in one
// process; a swarm node runs one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "data/loader.h"
#include "engine/config.h"
#include "kernels/backend.h"
#include "engine/device_group.h"
#include "engine/evaluator.h"
#include "optimizer/outer_round.h"

namespace starling {

// The training stream of replica `index`: partition index of `partitions`, shuffled by node_id.
std::unique_ptr<DataLoader> make_train_loader(const TrainConfig& train, int partitions, int index,
                                              uint64_t node_id);

class Replica {
public:
    // theta = phi = the weights initialised from train.seed (every replica starts equal); the
    // data is partition `index` of `partitions`.
    Replica(const TrainConfig& train, int partitions, const Backend& backend, int index,
            uint64_t node_id);

    // `steps` inner AdamW steps from theta; returns the mean training loss.
    double inner_phase(int steps, const LrSchedule& schedule) {
        return inner_phase(steps, schedule, steps);
    }
    // The same, with the learning rate of `schedule_steps` steps spread over them: a replica that
    // takes more or fewer steps than H in a round (token-budget rounds, docs/uneven.md) follows
    // the swarm's schedule by rounds, not by its own step count. inner_step() advances by
    // schedule_steps.
    double inner_phase(int steps, const LrSchedule& schedule, int schedule_steps);
    // Data-parallel training instead: each step averages the gradients of one batch from every
    // stream before the AdamW update. Returns the mean training loss.
    double averaged_gradient_phase(int steps, const LrSchedule& schedule,
                                   std::span<const std::unique_ptr<DataLoader>> streams);
    // D = theta - phi into displacement().
    void compute_displacement();
    // theta = phi: the start of the next round; with_residual: theta = phi + residual, where a
    // DiLoCo member keeps what its message left unsent in its weights
    // (EngineConfig::residual_in_weights).
    void restart_from_phi(bool with_residual = false);
    // theta = start: an overlapped round's start (engine/overlap.h).
    void restart_from(std::span<const float> start);
    // theta = phi + (theta - start): an outer step that lands after training went on from start
    // (overlapped rounds, optimizer/outer.h); with_residual adds the residual as above.
    void rebase_onto_phi(std::span<const float> start, bool with_residual = false);
    // phi = theta: a round with no outer step (local-only and data-parallel training).
    void adopt_theta();
    // Rejoining after a drop-out (docs/spec.md section 6): phi, outer momentum, AdamW state and
    // step counts from the sponsor, theta = phi, residual zero, and a new node id, so a new data
    // order.
    void rejoin_from(const Replica& sponsor, uint64_t new_node_id);
    // Bytes of the snapshot a rejoining replica fetches.
    size_t snapshot_bytes() const;

    int index() const { return index_; }
    uint64_t node_id() const { return node_id_; }
    int64_t inner_step() const { return inner_step_; }
    // A node adopting a snapshot continues the learning-rate schedule where its donor was.
    void set_inner_step(int64_t step) { inner_step_ = step; }
    size_t size() const { return group_->num_params(); }

    // theta on the host: the parameter arena itself on the CPU backend; on a GPU, a copy taken
    // at the end of every inner phase and whenever theta is set.
    std::span<const float> theta() const;
    std::span<float> phi() { return phi_; }
    std::span<const float> phi() const { return phi_; }
    std::span<float> momentum() { return momentum_; }
    std::span<float> residual() { return residual_; }
    std::span<float> displacement() { return displacement_; }
    const ParameterManifest& manifest() const { return group_->lead().manifest(); }
    DeviceGroup& device_group() { return *group_; }  // the model and AdamW on each device
    int64_t adamw_steps() { return group_->lead_adamw().steps_taken(); }
    void set_adamw_steps(int64_t steps) { group_->set_steps_taken(steps); }
    // AdamW's moments on the host (the arenas themselves on the CPU backend, a fresh copy on a
    // GPU), and setting them from host values.
    std::span<const float> adamw_m_host();
    std::span<const float> adamw_v_host();
    void set_adamw_moments(std::span<const float> m, std::span<const float> v);
    PartnerChecks& partner_checks() { return checks_; }
    // The loss of whole weights on the held-out batch: the validation batch after the
    // eval_batches the evaluator scores, which no replica trains on (NoLoCo's check of a
    // partner's weights, optimizer/outer_round.h). Its model is made at the first call.
    double held_out_loss(std::span<const float> weights);
    // Whether there is a held-out batch: false, warned once, where the data holds no validation
    // split a batch long (the check is then off, not the round).
    bool held_out_available();
    DataLoader& data() { return *data_; }  // its position goes into a node's checkpoint

    bool live = true;

private:
    void refresh_theta_mirror();
    std::span<const float> host_view(const float* arena, std::vector<float>& mirror);

    TrainConfig train_;
    int partitions_;
    int index_;
    uint64_t node_id_;
    std::unique_ptr<DeviceGroup> group_;
    std::unique_ptr<DataLoader> data_;
    std::vector<int32_t> inputs_, targets_;
    // Copies of backend arenas where backend memory is not host memory (empty otherwise).
    std::vector<float> theta_mirror_, adamw_m_mirror_, adamw_v_mirror_;
    std::vector<float> phi_, momentum_, residual_, displacement_;
    PartnerChecks checks_;
    const Backend* backend_;
    std::unique_ptr<Evaluator> held_out_;
    bool held_out_missing_ = false;
    int64_t inner_step_ = 0;
};

}  // namespace starling
