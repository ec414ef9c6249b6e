// The process_* families every Prometheus client library exports, under the same names and
// meanings as the Go client's, so the usual dashboards and alerts work on starlingd: CPU seconds,
// resident and virtual memory, open and allowed file descriptors, start time. Read from /proc at
// each scrape; prometheus-cpp has no process collector.
#pragma once

#include <vector>

#include <prometheus/metric_family.h>

namespace starling {

// This process's figures now; a figure /proc does not give (no procfs) is left out.
std::vector<prometheus::MetricFamily> process_metric_families();

}  // namespace starling
