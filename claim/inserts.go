package claim

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrInsertsUnreadable is LastInsertID's error when the insert sequence
// cannot be read, and will not be on retrying: the seq column owns no
// sequence, or the role may not read it. The insert rate can then only be
// read from the ids claimed.
var ErrInsertsUnreadable = errors.New("the insert sequence cannot be read")

// LastInsertID returns the last value the seq column's sequence handed
// out, one per insert. It grows with every insert, committed, rolled back
// or not yet committed, and is read outside MVCC: the producers' pace,
// which the rows the relay claims only follow as fast as the relay keeps
// up. The sequence is looked
// up on the first call. Reading it needs USAGE or SELECT on the sequence
// (sql/outboxrelay_role.sql grants SELECT).
func (s *Store) LastInsertID(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	seq, err := s.insertSequence(ctx)
	if err != nil {
		return 0, err
	}
	r, err := s.db.Query(ctx, s.q.lastInsertID, seq)
	var id int64
	if err == nil {
		id, err = pgx.CollectExactlyOneRow(r, pgx.RowTo[int64])
	}
	if err != nil {
		return 0, fmt.Errorf("last insert id: %w", sequenceError(err, seq))
	}
	return id, nil
}

// sequenceError is err, or ErrInsertsUnreadable if err says the role may
// not read the sequence seq.
func sequenceError(err error, seq string) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
		return fmt.Errorf("%w: %v (grant SELECT on %s: sql/outboxrelay_role.sql)", ErrInsertsUnreadable, err, seq)
	}
	return err
}

// NotifyWaiters returns how many transactions wait, at this moment, to
// commit behind the lock every commit that sent NOTIFY takes: PostgreSQL
// serializes those commits, each holding the lock through its WAL flush,
// so waiters mean producers that notify are held back by it. The lock is
// one for the whole server, so producers notifying on other tables count
// as well. Any role may read it.
func (s *Store) NotifyWaiters(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	r, err := s.db.Query(ctx, s.q.notifyWaiters)
	var n int
	if err == nil {
		n, err = pgx.CollectExactlyOneRow(r, pgx.RowTo[int])
	}
	if err != nil {
		return 0, fmt.Errorf("notify waiters: %w", err)
	}
	return n, nil
}

// insertSequence looks the seq column's sequence up once.
func (s *Store) insertSequence(ctx context.Context) (string, error) {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	if s.seq != nil {
		return *s.seq, nil
	}
	r, err := s.db.Query(ctx, s.q.insertSequence, s.q.table, s.cfg.Columns.Seq)
	if err != nil {
		return "", fmt.Errorf("insert sequence: %w", err)
	}
	seq, err := pgx.CollectExactlyOneRow(r, pgx.RowTo[*string])
	if err != nil {
		return "", fmt.Errorf("insert sequence: %w", err)
	}
	if seq == nil {
		return "", fmt.Errorf("insert sequence of %s.%s: %w: the column owns no sequence", s.q.table, s.cfg.Columns.Seq, ErrInsertsUnreadable)
	}
	s.seq = seq
	return *seq, nil
}
