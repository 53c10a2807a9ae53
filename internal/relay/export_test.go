package relay

import "time"

// IdleInsertsEvery is idleInsertsEvery, for the tests of package relay_test.
const IdleInsertsEvery = idleInsertsEvery

// NextPoll is the relay's nextPoll for a relay of cfg.
func NextPoll(cfg Config) time.Duration { return (&Relay{cfg: cfg}).nextPoll() }
