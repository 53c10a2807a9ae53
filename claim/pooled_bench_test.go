package claim_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// BenchmarkClaimAndMark claims one event and marks it published, the work
// of a batch at an everyday rate (one event per claim), on a direct pool
// with session settings and prepared statements, and pooled (settings sent
// with each statement, nothing prepared) both directly and through
// PgBouncer in transaction mode. An op is one event; the relay's own code
// around the two statements is the same in every case.
//
//	go test -run '^$' -bench ClaimAndMark -benchtime 3000x -count 5 ./claim
func BenchmarkClaimAndMark(b *testing.B) {
	for _, ordering := range []claim.Ordering{claim.OrderNone, claim.OrderAggregate} {
		for _, mode := range []string{"direct", "pooled", "pgbouncer"} {
			b.Run(string(ordering)+"/"+mode, func(b *testing.B) {
				url, setup := testkit.NewOutbox(b)
				ensureOrderingIndex(b, url)
				testkit.InsertEvents(b, setup, b.N)
				testkit.Exec(b, setup, `VACUUM ANALYZE outbox`)

				cfg := claim.Config{Ordering: ordering, Pooled: mode != "direct"}
				poolURL := url
				if mode == "pgbouncer" {
					poolURL = testkit.NewPgBouncer(b, url)
				}
				pcfg, err := pgxpool.ParseConfig(poolURL)
				require.NoError(b, err)
				cfg.ConfigurePool(pcfg)
				pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
				require.NoError(b, err)
				b.Cleanup(pool.Close)
				s, err := claim.New(pool, cfg)
				require.NoError(b, err)
				ctx := context.Background()

				b.ResetTimer()
				for range b.N {
					batch, err := s.Claim(ctx, 1)
					if err != nil || len(batch.Events) != 1 {
						b.Fatalf("claim: %d events, %v", len(batch.Events), err)
					}
					if _, err := s.MarkPublished(ctx, []int64{batch.Events[0].ID}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
