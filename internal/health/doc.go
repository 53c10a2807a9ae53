// Package health answers Kubernetes-style probes for the relay.
//
// /livez says whether the relay's loops run; it checks no outside service,
// so an outage of PostgreSQL or RabbitMQ never has every relay restarted at
// once. /readyz says whether the relay can relay now: a Monitor runs its
// checks (PostgreSQL reachable, the listener connected, RabbitMQ connected
// and not blocking the relay, the table and its trigger in place) every
// interval and answers from their last results, 200 or 503 with a short
// JSON reason, so probes cost the services nothing.
package health
