// A real starlingd's /metrics before and after its first values: a figure that has none yet (a
// loss before the first round or evaluation, a checkpoint before the first) is absent, not 0,
// since a 0 is a reading to Prometheus (min_over_time of the validation loss was 0 for six hours
// after every start, and StarlingValLossRising fired on healthy nodes); once there, it is what
// `starling status` says.
#include <catch2/catch.hpp>
#include <cmath>

#include "tests/integration/daemon_harness.h"
#include "tests/support/files.h"
#include "tests/support/metrics_text.h"

using namespace starling::test;
using namespace std::chrono_literals;
using nlohmann::json;

TEST_CASE("starlingd's /metrics leaves out the losses until their first value, then shows status's",
          "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path());
    // A seed where nothing listens holds the daemon in its start for join_timeout_s (10 s, the
    // harness's), before any round: long enough to scrape it there on a busy machine, and status
    // says afterwards whether the scrape was indeed taken before the first round.
    const std::string nobody = "127.0.0.1:" + std::to_string(free_port());
    a.start({nobody}, {{"STARLING_SWARM_EVAL_EVERY", "5"}});

    // /metrics answers from the daemon's first moments; the node's position is there once it has
    // loaded its state (build info with it), and the losses only after rounds.
    std::string before;
    eventually("a's /metrics shows the node's position", 30s, [&] {
        before = http_get(a.metrics_port(), "/metrics");
        return metric_families(before).count("starling_build_info") == 1;
    });
    json status;
    eventually("a's status answers", 30s, [&] {
        try {
            status = a.status();
            return true;
        } catch (const std::exception&) {
            return false;
        }
    });
    INFO("the scrape before the first round:\n" << before);
    REQUIRE(json_u64(status["round"]) == 0);  // read after the scrape: no round before it either
    for (const char* name :
         {"starling_train_loss", "starling_val_loss", "starling_tokens_per_second",
          "starling_compression_ratio", "starling_partner_distance", "starling_checkpoint_round",
          "starling_checkpoint_timestamp_seconds"}) {
        INFO(name);
        CHECK_FALSE(sample_value(before, name).has_value());
        CHECK(metric_families(before).count(name) == 0);
    }
    CHECK(sample_value(before, "starling_round") == 0.0);
    CHECK(sample_value(before, "starling_train_steps_target") == 100000.0);

    // Alone after the join timeout, it trains; its first evaluation is at round 5. The scrape
    // is compared with a status that did not change around it (evaluations keep coming).
    eventually("a evaluates phi and its /metrics shows the status's validation loss", 90s, [&] {
        try {
            const json s1 = a.status();
            const std::string metrics = http_get(a.metrics_port(), "/metrics");
            const json s2 = a.status();
            if (!s1.contains("val_loss") || !s2.contains("val_loss") ||
                s1["val_loss"] != s2["val_loss"])
                return false;
            const double reported = s2["val_loss"].get<double>();
            const auto scraped = sample_value(metrics, "starling_val_loss");
            INFO(metrics);
            REQUIRE(scraped.has_value());
            CHECK(*scraped == Approx(reported).epsilon(1e-12));
            CHECK(std::isfinite(*scraped));
            CHECK(*scraped > 0.5);  // nats per byte of a pico model: far from 0
            CHECK(sample_value(metrics, "starling_train_loss").has_value());
            CHECK(sample_value(metrics, "starling_checkpoint_round").has_value());
            return true;
        } catch (const std::runtime_error&) {  // status not answering for a moment
            return false;
        }
    });
}
