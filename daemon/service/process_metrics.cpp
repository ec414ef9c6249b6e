#include "daemon/service/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

namespace starling {

namespace {

prometheus::MetricFamily family(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
    prometheus::ClientMetric metric;
    if (type == prometheus::MetricType::Counter) {
        metric.counter.value = value;
    } else {
        metric.gauge.value = value;
    }
    return {std::move(name), std::move(help), type, {metric}};
}

// The fields of /proc/self/stat after the command name, which may hold spaces and parentheses:
// fields[0] is the state, field 3 of proc(5), so field N is fields[N - 3].
std::vector<std::string> stat_fields() {
    std::ifstream in("/proc/self/stat");
    const std::string line((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t end_of_name = line.rfind(')');
    if (end_of_name == std::string::npos) return {};
    std::istringstream rest(line.substr(end_of_name + 1));
    return {std::istream_iterator<std::string>(rest), std::istream_iterator<std::string>()};
}

// When the machine booted, in Unix seconds ("btime" in /proc/stat).
std::optional<double> boot_time() {
    std::ifstream in("/proc/stat");
    for (std::string key; in >> key;) {
        if (key == "btime") {
            double seconds = 0;
            if (in >> seconds) return seconds;
            return std::nullopt;
        }
        in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    return std::nullopt;
}

}  // namespace

std::vector<prometheus::MetricFamily> process_metric_families() {
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> families;
    const std::vector<std::string> fields = stat_fields();
    if (fields.size() >= 22) {
        const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
        const double page_bytes = static_cast<double>(sysconf(_SC_PAGESIZE));
        const double user_ticks = std::stod(fields[14 - 3]),
                     system_ticks = std::stod(fields[15 - 3]);
        families.push_back(
            family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                   MetricType::Counter, (user_ticks + system_ticks) / ticks_per_second));
        families.push_back(family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                                  MetricType::Gauge, std::stod(fields[23 - 3])));
        families.push_back(family("process_resident_memory_bytes", "Resident memory size in bytes.",
                                  MetricType::Gauge, std::stod(fields[24 - 3]) * page_bytes));
        if (const auto booted = boot_time())
            families.push_back(family("process_start_time_seconds",
                                      "Start time of the process since unix epoch in seconds.",
                                      MetricType::Gauge,
                                      *booted + std::stod(fields[22 - 3]) / ticks_per_second));
    }
    std::error_code error;
    const auto descriptors = std::filesystem::directory_iterator("/proc/self/fd", error);
    if (!error)
        families.push_back(family("process_open_fds", "Number of open file descriptors.",
                                  MetricType::Gauge,
                                  static_cast<double>(std::distance(descriptors, {}))));
    if (rlimit limit{}; getrlimit(RLIMIT_NOFILE, &limit) == 0)
        families.push_back(family("process_max_fds", "Maximum number of open file descriptors.",
                                  MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
    return families;
}

}  // namespace starling
