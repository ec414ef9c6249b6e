// starlingd: one node of a swarm as a long-lived service. Standalone Asio runs the event loop:
// signals (SIGTERM and SIGINT drain, SIGHUP reloads), systemd's watchdog and STATUS line, and the
// peer and failure metrics; the round loop has a thread of its own; gRPC serves the peer port and
// the Control API on its threads. See daemon/README.md.
//
// The daemon's whole life is here, in a library, so that a test binary can run the very same
// daemon with a hook set beforehand (tests/integration/faulty_starlingd.cpp).
#pragma once

namespace starling {

// The whole life of the daemon, from the command line to the drain; its exit status.
int run_daemon(int argc, char** argv);

// Ends the process with `status` once logs are flushed, without static destructors: gRPC's own
// threads outlive every gRPC object and may log at any time, and returning from main destroyed
// spdlog's and gRPC's statics under them (a node exiting after a drain once died of SIGSEGV).
[[noreturn]] void end_process(int status);

}  // namespace starling
