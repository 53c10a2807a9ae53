package metrics

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHorizonAgesHoldersAcrossSamples feeds observe the rows of successive
// samples, as horizonSQL returns them, a minute apart: holders without a
// transaction start (a slot, a standby's feedback, another role's session)
// are aged from the first sample that saw their oldest ID, and from 0
// again when that ID changes; a transaction start PostgreSQL shows wins;
// holders without a row are at 0.
func TestHorizonAgesHoldersAcrossSamples(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	seconds := func(s float64) *float64 { return &s }
	zero := map[string]holderAge{}
	for _, kind := range holders {
		zero[kind] = holderAge{}
	}
	with := func(ages map[string]holderAge) map[string]holderAge {
		out := map[string]holderAge{}
		for kind, a := range zero {
			out[kind] = a
		}
		for kind, a := range ages {
			out[kind] = a
		}
		return out
	}
	var h horizon
	for i, sample := range []struct {
		name string
		rows []holderRow
		want map[string]holderAge
	}{
		{"nothing holds", nil, zero},
		{"a slot's xmin and a backend first seen", []holderRow{
			{kind: holderReplicationSlot, age: 10, xid: "1000"},
			{kind: holderBackend, age: 4, xid: "1006", seconds: seconds(30)},
		}, with(map[string]holderAge{
			holderReplicationSlot: {transactions: 10},
			holderBackend:         {transactions: 4, seconds: 30},
		})},
		{"the slot's xmin unchanged a minute later", []holderRow{
			{kind: holderReplicationSlot, age: 50, xid: "1000"},
			{kind: holderBackend, age: 44, xid: "1006", seconds: seconds(90)},
		}, with(map[string]holderAge{
			holderReplicationSlot: {transactions: 50, seconds: 60},
			holderBackend:         {transactions: 44, seconds: 90},
		})},
		{"the slot's xmin moved on; a standby's feedback and another role's session", []holderRow{
			{kind: holderReplicationSlot, age: 3, xid: "1087"},
			{kind: holderStandbyFeedback, age: 7, xid: "1083"},
			{kind: holderBackend, age: 80, xid: "1010"},
		}, with(map[string]holderAge{
			holderReplicationSlot: {transactions: 3},
			holderStandbyFeedback: {transactions: 7},
			holderBackend:         {transactions: 80},
		})},
		{"both unchanged", []holderRow{
			{kind: holderReplicationSlot, age: 33, xid: "1087"},
			{kind: holderStandbyFeedback, age: 37, xid: "1083"},
			{kind: holderBackend, age: 110, xid: "1010"},
		}, with(map[string]holderAge{
			holderReplicationSlot: {transactions: 33, seconds: 60},
			holderStandbyFeedback: {transactions: 37, seconds: 60},
			holderBackend:         {transactions: 110, seconds: 60},
		})},
		{"the slot gone; a transaction start a hair ahead of the statement is 0 s", []holderRow{
			{kind: holderStandbyFeedback, age: 40, xid: "1083"},
			{kind: holderReplicationSlotCatalog, age: 2, xid: "1118", seconds: seconds(-0.001)},
		}, with(map[string]holderAge{
			holderStandbyFeedback:        {transactions: 40, seconds: 120},
			holderReplicationSlotCatalog: {transactions: 2},
		})},
		{"the slot back with the xmin it had: aged anew", []holderRow{
			{kind: holderReplicationSlot, age: 40, xid: "1087"},
		}, with(map[string]holderAge{
			holderReplicationSlot: {transactions: 40},
		})},
	} {
		now := start.Add(time.Duration(i) * time.Minute)
		require.Equal(t, sample.want, h.observe(sample.rows, now), "sample %d: %s", i, sample.name)
	}

	h.reset()
	require.Equal(t, with(map[string]holderAge{holderReplicationSlot: {transactions: 41}}),
		h.observe([]holderRow{{kind: holderReplicationSlot, age: 41, xid: "1087"}}, start.Add(time.Hour)),
		"a sampler that stopped sampling ages what it sees anew")
}
