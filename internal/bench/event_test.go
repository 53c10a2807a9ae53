package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEventIDRoundTrips(t *testing.T) {
	t.Parallel()
	for _, n := range []int64{0, 1, 255, 100000, maxEventNumber} {
		id := eventID(n)
		require.Len(t, id, 36)
		got, ok := parseEventID(id)
		require.True(t, ok, id)
		require.Equal(t, n, got)
	}
	require.Equal(t, "00000000-0000-4000-8000-0000000000ff", eventID(255))
	for _, id := range []string{"", "bench-sentinel-1", "9b2f6c1e-0000-4000-8000-0000000000ff", "00000000-0000-4000-8000-00000000zzzz"} {
		_, ok := parseEventID(id)
		require.False(t, ok, id)
	}
}

func TestPayloadIsAboutTheSizeAsked(t *testing.T) {
	t.Parallel()
	p := newPayloads(256)
	require.Equal(t, `{"n": 7, "pad": "`+p.pad+`"}`, p.of(7))
	require.InDelta(t, 256, len(p.of(12345)), 4)
	require.Equal(t, `{"n": 7, "pad": ""}`, newPayloads(1).of(7))
}

func TestRecordCountsDuplicatesLossAndLatency(t *testing.T) {
	t.Parallel()
	rec := newRecord(100, 4)
	for i := range 4 {
		rec.commit(i, 1_000_000)
	}
	rec.receive(100, 2_000_000, place{})
	rec.receive(101, 5_000_000, place{})
	rec.receive(101, 6_000_000, place{}) // a duplicate
	rec.receive(102, 500_000, place{})   // seen before its commit was noted
	rec.receive(99, 1, place{})          // not this record's
	rec.receive(104, 1, place{})
	require.EqualValues(t, 3, rec.count())
	require.EqualValues(t, 1, rec.duplicates())
	require.EqualValues(t, 1, rec.lost())
	require.EqualValues(t, 5_000_000, rec.lastReceived())
	require.Equal(t, &Latency{P50: 1, P90: 4, P99: 4, P999: 4, Max: 4}, rec.latency())
	require.Nil(t, newRecord(0, 3).latency())
}

func TestPercentileIsNearestRank(t *testing.T) {
	t.Parallel()
	xs := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.EqualValues(t, 5, percentile(xs, 50))
	require.EqualValues(t, 9, percentile(xs, 90))
	require.EqualValues(t, 10, percentile(xs, 99))
	require.EqualValues(t, 7, percentile([]int64{7}, 50))
}

func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	require.NoError(t, Config{RelayBinary: "/bin/true"}.Validate())
	require.ErrorContains(t, Config{}.Validate(), "RelayBinary")
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{DrainEvents: -1}, "DrainEvents"},
		{Config{SteadyRates: []int{100, 0}}, "SteadyRates 0"},
		{Config{ProducerConcurrency: []int{-2}}, "ProducerConcurrency -2"},
		{Config{Only: []string{"drain", "nope"}}, `Only "nope"`},
		{Config{IdleInterval: -1}, "IdleInterval"},
		{Config{DatabaseURL: "mysql://x"}, "DatabaseURL"},
		{Config{AMQPURL: "http://u:s3cret@h/"}, "AMQPURL"},
		{Config{Schema: string(make([]byte, 64))}, "Schema"},
		{Config{HorizonWindow: -time.Second}, "HorizonWindow"},
		{Config{HorizonBefore: -1}, "HorizonBefore"},
		{Config{Only: []string{"horizon"}, HorizonAggregates: 12}, "HorizonAggregates 12"},
	} {
		tc.cfg.RelayBinary = "/bin/true"
		err := tc.cfg.Validate()
		require.ErrorContains(t, err, tc.want)
		require.NotContains(t, err.Error(), "s3cret")
	}
}

// The p99.9 is the nearest rank: of 2,000 latencies 1 … 2,000 ms, the
// 1,998th (the p99 is the 1,980th, the max the 2,000th).
func TestLatencyPermille(t *testing.T) {
	xs := make([]int64, 2000)
	for i := range xs {
		xs[i] = int64(i + 1)
	}
	require.EqualValues(t, 1998, permille(xs, 999))
	require.EqualValues(t, 1980, percentile(xs, 99))
	require.EqualValues(t, 1, permille(xs[:1], 999))
}
