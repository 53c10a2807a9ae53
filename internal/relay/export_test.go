package relay

// IdleInsertsEvery is idleInsertsEvery, for the tests of package relay_test.
const IdleInsertsEvery = idleInsertsEvery
