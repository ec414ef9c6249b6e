// systemd's notify protocol (Type=notify): READY once the node serves, STATUS lines, WATCHDOG
// pings and STOPPING. Every call is a no-op when the process was not started by systemd.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace starling {

void notify_ready();
void notify_status(const std::string& line);
void notify_stopping();
void notify_watchdog();
// Half of WatchdogSec when systemd expects pings from this process, else nullopt.
std::optional<std::chrono::microseconds> watchdog_interval();

}  // namespace starling
