package health

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Answers records when PostgreSQL last answered one of the relay's
// statements without error. Set as the pool's pgx.QueryTracer, it lets the
// readiness check skip its ping while the relay's own statements (the
// gate's reading of the id sequence every second at rest, the claims while
// busy) prove the server answers: at rest that ping was one round trip in
// three, and each round trip wakes the relay and its backend.
type Answers struct {
	now  func() time.Time
	last atomic.Int64 // nanoseconds since start, 0 before any answer
	zero time.Time
}

// NewAnswers returns Answers timed by now (time.Now if nil).
func NewAnswers(now func() time.Time) *Answers {
	if now == nil {
		now = time.Now
	}
	return &Answers{now: now, zero: now()}
}

// TraceQueryStart implements pgx.QueryTracer.
func (a *Answers) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer: a statement that returned no
// error is an answer.
func (a *Answers) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil {
		a.last.Store(max(int64(a.now().Sub(a.zero)), 1))
	}
}

// Within reports whether PostgreSQL answered within d of now.
func (a *Answers) Within(d time.Duration) bool {
	last := a.last.Load()
	return last != 0 && a.now().Sub(a.zero)-time.Duration(last) <= d
}

// Check returns a check's Run that passes while PostgreSQL answered within
// d, and otherwise runs ping.
func (a *Answers) Check(d time.Duration, ping func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if a.Within(d) {
			return nil
		}
		return ping(ctx)
	}
}
