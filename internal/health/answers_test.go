package health_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/health"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// clock is a hand-moved time for Answers.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// The postgres check pings only when the pool's own statements have not
// been answered lately: an answered statement stands in for the ping, a
// failed one does not, and an answer older than the window does not.
func TestAnswersStandInForThePingWhileFresh(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1_000_000, 0)}
	answers := health.NewAnswers(c.Now)
	cfg, err := pgxpool.ParseConfig(testkit.PostgresURL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = answers
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()

	pings := 0
	check := answers.Check(2*time.Second, func(ctx context.Context) error { pings++; return pool.Ping(ctx) })
	ctx := context.Background()

	require.NoError(t, check(ctx))
	require.Equal(t, 1, pings, "no statement answered yet: the check pings")

	var one int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one))
	c.Advance(2 * time.Second)
	require.NoError(t, check(ctx))
	require.Equal(t, 1, pings, "a statement answered 2 s ago stands in for the ping")

	c.Advance(time.Millisecond)
	require.NoError(t, check(ctx))
	require.Equal(t, 2, pings, "an answer older than the window does not")

	c.Advance(time.Minute)
	_, err = pool.Exec(ctx, "SELECT 1/0")
	require.Error(t, err)
	require.False(t, answers.Within(time.Second), "a statement that failed is no answer")
	down := answers.Check(2*time.Second, func(context.Context) error { return errors.New("down") })
	require.EqualError(t, down(ctx), "down")
}
