// starlingd with a faulty member's round link, for the integration tests only (never installed):
//
//   faulty_starlingd --fault KIND [--fault-scale X] <starlingd's arguments>
//
// runs the daemon of daemon/starlingd/run_daemon.h whose outgoing messages (and token claims) are
// altered as the fault study's faulty members' are (experiment/fault.h: sign_flip, scaled, noise,
// free_rider, replay, bias, tokens, non_finite). Its own state stays honest. Config faults need no
// binary of their own (a mistyped setting is an environment variable), and an echo needs the
// partner's message as sent, which only the experiment's board keeps.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/openmp_wait.h"
#include "daemon/starlingd/run_daemon.h"
#include "daemon/swarm/swarm_node.h"
#include "experiment/fault.h"

namespace {

using namespace starling;

// The fault named by the leading options, which are taken out of argv.
FaultConfig take_fault(int& argc, char**& argv) {
    FaultConfig fault;
    if (argc < 3 || std::strcmp(argv[1], "--fault") != 0)
        throw Error("usage: faulty_starlingd --fault KIND [--fault-scale X] <starlingd arguments>");
    fault.kind = fault_kind_from_name(argv[2]);
    int taken = 2;
    if (argc >= 5 && std::strcmp(argv[3], "--fault-scale") == 0) {
        fault.scale = std::stod(argv[4]);
        taken = 4;
    }
    if (!fault_alters_messages(fault.kind) || fault.kind == FaultKind::Echo)
        throw Error(std::string("fault \"") + argv[2] +
                    "\" does not alter a daemon's messages here (a config fault is a setting)");
    argv[taken] = argv[0];
    argv += taken;
    argc -= taken;
    return fault;
}

}  // namespace

int main(int argc, char** argv) {
    // With every argument, before they are taken apart: run_daemon would execute the program
    // again with what it was given, without the fault.
    restart_unless_openmp_wait_policy_set(argv);
    FaultConfig fault;
    try {
        fault = take_fault(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "faulty_starlingd: %s\n", e.what());
        return 2;
    }
    // One node per process; its memory lives as long as the process.
    static FaultMemory memory;
    set_round_link_wrapper([fault](std::unique_ptr<RoundLink> link, const SwarmConfig& config,
                                   Replica& replica) -> std::unique_ptr<RoundLink> {
        return std::make_unique<FaultyLink>(std::move(link), fault, config, replica.manifest(),
                                            replica.node_id(), replica.phi(), memory);
    });
    end_process(run_daemon(argc, argv));
}
