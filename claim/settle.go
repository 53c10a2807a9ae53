package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// MarkPublished marks events confirmed by RabbitMQ as published, in one
// statement; under Config.DeleteConfirmed it deletes their rows. It returns
// how many rows changed; fewer than len(ids) means another relay got there
// first after this one's lease expired.
func (s *Store) MarkPublished(ctx context.Context, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	tag, err := s.db.Exec(ctx, s.q.markPublished, ids)
	if err != nil {
		return 0, fmt.Errorf("mark published: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Retry puts failed events back with their error text, each after its retry
// delay, or dead-letters them (status failed) when they are permanent
// failures or have used MaxAttempts.
func (s *Store) Retry(ctx context.Context, lease LeaseID, failures []Failure) (RetryResult, error) {
	var res RetryResult
	if len(failures) == 0 {
		return res, nil
	}
	ids := make([]int64, len(failures))
	statuses := make([]string, len(failures))
	delays := make([]int64, len(failures))
	errs := make([]string, len(failures))
	for i, f := range failures {
		ids[i] = f.ID
		errs[i] = errorText(f.Err)
		if s.deadLetters(f) {
			statuses[i] = s.cfg.Statuses.Failed
			res.Dead++
			res.DeadIndex = append(res.DeadIndex, i)
			continue
		}
		statuses[i] = s.cfg.Statuses.Pending
		d := s.cfg.RetryDelay(f.Attempts, s.jitter())
		delays[i] = d.Milliseconds()
		res.Due = append(res.Due, d)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	rows, err := s.db.Query(ctx, s.q.retry, ids, statuses, delays, errs, lease)
	var back []putBack
	if err == nil {
		back, err = collectPutBack(rows)
	}
	if err != nil {
		return RetryResult{}, fmt.Errorf("retry: %w", err)
	}
	// Those put back below the floor are parked, to be claimed when due.
	s.park(back)
	return res, nil
}

// maxErrorText bounds what is kept of an error in last_error.
const maxErrorText = 2000

// errorText makes an error storable as text: valid UTF-8, no NUL bytes,
// bounded length.
func errorText(err error) string {
	if err == nil {
		err = errors.New("unknown error")
	}
	s := strings.ToValidUTF8(err.Error(), "?")
	s = strings.ReplaceAll(s, "\x00", "?")
	if len(s) > maxErrorText {
		s = s[:maxErrorText]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// Extend renews the lease on events still held by it, for another
// Config.Lease from now, and returns how many it renewed: the rows settled
// meanwhile (published, retried, released) or taken by another claim after
// the lease lapsed are left alone.
func (s *Store) Extend(ctx context.Context, lease LeaseID, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	tag, err := s.db.Exec(ctx, s.q.extend, ids, lease, s.cfg.Lease.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("extend lease: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Release gives leased events back unpublished, without counting the attempt:
// they are claimable again at once.
func (s *Store) Release(ctx context.Context, lease LeaseID, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	rows, err := s.db.Query(ctx, s.q.release, ids, lease)
	var back []putBack
	if err == nil {
		back, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (b putBack, err error) {
			return b, r.Scan(&b.id, &b.seq)
		})
	}
	if err != nil {
		return 0, fmt.Errorf("release: %w", err)
	}
	s.park(back) // due at once
	return int64(len(back)), nil
}

// collectPutBack reads the retry statement's rows: those put back pending,
// with their seq and delay (the dead-lettered ones have a negative delay).
func collectPutBack(rows pgx.Rows) ([]putBack, error) {
	var back []putBack
	for rows.Next() {
		var b putBack
		var delayMS int64
		if err := rows.Scan(&b.id, &b.seq, &delayMS); err != nil {
			rows.Close()
			return nil, err
		}
		if delayMS >= 0 {
			b.due = time.Duration(delayMS) * time.Millisecond
			back = append(back, b)
		}
	}
	return back, rows.Err()
}

// DeletePublished deletes up to limit published events older than retention
// and returns how many it deleted. Pending and failed events are never
// touched.
//
// It starts where the last call got to, by published_at, less
// cleanupMargin (a mark's transaction may commit a moment after an earlier
// published_at was deleted), and from the oldest published row again every
// cleanupFromStart: the rows deleted before have left index entries that
// vacuum cannot remove while a long transaction may see them, and each
// call would walk them all again.
func (s *Store) DeletePublished(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()
	if now := s.now(); now.Sub(s.cleanupReset) >= cleanupFromStart {
		s.cleanupFrom, s.cleanupReset = time.Time{}, now
	}
	rows, err := s.db.Query(ctx, s.q.deletePublished, retention.Milliseconds(), limit, s.cleanupFrom)
	var (
		n    int64
		last pgtype.Timestamptz
	)
	if err == nil {
		_, err = pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (struct{}, error) {
			return struct{}{}, r.Scan(&n, &last)
		})
	}
	if err != nil {
		return 0, fmt.Errorf("delete published: %w", err)
	}
	if last.Valid && last.Time.Add(-cleanupMargin).After(s.cleanupFrom) {
		s.cleanupFrom = last.Time.Add(-cleanupMargin)
	}
	return n, nil
}

// Where cleanup starts (see DeletePublished).
const (
	cleanupMargin    = 10 * time.Second
	cleanupFromStart = time.Hour
)
