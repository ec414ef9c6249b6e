// starlingd: one node of a swarm as a long-lived service (daemon/starlingd/run_daemon.h).
#include "daemon/starlingd/run_daemon.h"

int main(int argc, char** argv) { starling::end_process(starling::run_daemon(argc, argv)); }
