package claim_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// Under the relay's settings (claim.Config.ConfigurePool) PostgreSQL plans
// the claim once per connection and runs that plan at every claim, in both
// modes: left to choose, it plans the claim anew at each execution, which
// costs several times what running it does.
func TestClaimIsPlannedOnceAndReused(t *testing.T) {
	t.Parallel()
	for _, ordering := range []claim.Ordering{claim.OrderNone, claim.OrderAggregate} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url, setup := testkit.NewOutbox(t)
			if ordering == claim.OrderAggregate {
				ensureOrderingIndex(t, url)
			}
			testkit.InsertEvents(t, setup, 20)
			pool, s := relayStore(t, url, claim.Config{Ordering: ordering}, func(pc *pgxpool.Config) {
				pc.MaxConns = 1 // every statement on the connection read below
			})
			const claims = 8
			for range claims {
				_, err := s.Claim(ctx, 2)
				require.NoError(t, err)
			}
			var generic, custom int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
				claim.Statements(s)["claim"]).Scan(&generic, &custom))
			require.Zero(t, custom, "custom plans of the claim")
			require.EqualValues(t, claims, generic, "executions of the claim's generic plan")
		})
	}
}

// The relay's sessions never compile a statement with LLVM. Under the
// store's settings the table check, which has no index to walk, is costed
// above 10^10 (enable_seqscan off) and was compiled and inlined at every
// execution: 100 to 200 ms of the backend's CPU every 15 s at rest.
func TestTableCheckCompilesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, setup := testkit.NewOutbox(t)
	pool, s := relayStore(t, url, claim.Config{})
	var available bool // with jit on, as in the setup's session
	require.NoError(t, setup.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available))
	require.True(t, available, "this test needs PostgreSQL's JIT (llvmjit) to show that the relay's sessions turn it off")

	plan := planOf(t, pool, "EXPLAIN "+claim.Statements(s)["check"])
	require.Contains(t, plan, "Seq Scan", "the check has no index to walk:\n%s", plan)
	require.NotContains(t, plan, "JIT", plan)
	require.NoError(t, s.Check(ctx))
}
