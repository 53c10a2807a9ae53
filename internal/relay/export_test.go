package relay

import "time"

// NextPoll is the relay's nextPoll for a relay of cfg.
func NextPoll(cfg Config) time.Duration { return (&Relay{cfg: cfg}).nextPoll() }
