// Package faults is the relay's fault-injection suite: real relay processes
// against the real PostgreSQL and RabbitMQ, killed, stopped and cut off at
// random moments while a counting consumer records every message id. Each
// scenario reports events committed, delivered, lost and duplicated, and
// the time to recover; lost must be zero in every run.
//
// The suite restarts and disturbs shared services, so it runs on its own,
// after the main tests, one package at a time (.ci/run does this):
//
//	go test -tags faults -count=1 -p 1 ./faults
//
// Timing is randomized from a seed that every run prints; FAULTS_SEED=<n>
// replays it.
package faults
