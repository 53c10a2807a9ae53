// Package monitoring holds the relay's deployment files for Prometheus and
// Grafana, and the tests that check them; it has no Go code to import.
//
//   - prometheus/alerts.yml: the alerting rules, with their unit tests in
//     prometheus/alerts_test.yml (promtool test rules).
//   - prometheus/prometheus.yml: the scrape configuration of the local
//     stack (docker compose --profile observability).
//   - grafana/dashboards/outboxrelay.json: the dashboard, and
//     grafana/provisioning: how the local stack's Grafana loads it and its
//     Prometheus data source.
//
// The tests run promtool over the rules, and run a real relay and a real
// Prometheus scraping it to evaluate every dashboard query and every alert
// expression against the metrics the relay exports. They need promtool and
// prometheus (Debian's prometheus package) besides PostgreSQL and
// RabbitMQ; they fail, never skip, without them.
package monitoring
