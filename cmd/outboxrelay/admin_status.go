package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/outboxrelay/outboxrelay/internal/admin"
)

// StatusCmd shows the state of the outbox.
type StatusCmd struct {
	AdminFlags
}

type statusJSON struct {
	Table     string `json:"table"`
	Pending   int64  `json:"pending"`
	Published int64  `json:"published"`
	Failed    int64  `json:"failed"`
	InFlight  int64  `json:"in_flight"`
	Retrying  int64  `json:"retrying"`
	Scheduled int64  `json:"scheduled"`
	// OldestPendingAgeSeconds is null when no pending event is due or
	// attempted.
	OldestPendingAgeSeconds *float64        `json:"oldest_pending_age_seconds"`
	FailedByEventType       []typeCountJSON `json:"failed_by_event_type"`
	// Blocked is null unless --ordering aggregate --ordered-dead-letter block.
	Blocked *blockedJSON `json:"blocked"`
}

type typeCountJSON struct {
	EventType string `json:"event_type"`
	Count     int64  `json:"count"`
}

type blockedJSON struct {
	Aggregates int64                  `json:"aggregates"`
	Waiting    int64                  `json:"waiting"`
	First      []blockedAggregateJSON `json:"first"`
}

type blockedAggregateJSON struct {
	Key       []*string `json:"key"`
	FailedID  int64     `json:"failed_id"`
	EventType string    `json:"event_type"`
	Waiting   int64     `json:"waiting"`
}

// Run prints the counts per status, the age of the oldest pending event,
// the dead-lettered events by type and, in ordered mode, the blocked
// aggregates.
func (c *StatusCmd) Run(ctx context.Context, stdout io.Writer) error {
	a, closeConn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	s, err := a.Status(ctx)
	if err != nil {
		return c.tableError(err)
	}
	out := statusJSON{
		Table: c.Table, Pending: s.Pending, Published: s.Published, Failed: s.Failed,
		InFlight: s.InFlight, Retrying: s.Retrying, Scheduled: s.Scheduled,
	}
	if s.OldestPending != nil {
		secs := s.OldestPending.Seconds()
		out.OldestPendingAgeSeconds = &secs
	}
	out.FailedByEventType = make([]typeCountJSON, len(s.FailedByEventType))
	for i, f := range s.FailedByEventType {
		out.FailedByEventType[i] = typeCountJSON(f)
	}
	if s.Blocked != nil {
		out.Blocked = &blockedJSON{Aggregates: s.Blocked.Aggregates, Waiting: s.Blocked.Waiting}
		out.Blocked.First = make([]blockedAggregateJSON, len(s.Blocked.First))
		for i, b := range s.Blocked.First {
			out.Blocked.First[i] = blockedAggregateJSON(b)
		}
	}
	if c.JSON {
		return writeJSON(stdout, out)
	}
	return writeStatus(stdout, c.Table, s)
}

func writeStatus(w io.Writer, table string, s admin.Status) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "table\t%s\n", table)
	oldest := "none due"
	if s.OldestPending != nil {
		oldest = "oldest " + age(*s.OldestPending)
	}
	fmt.Fprintf(tw, "pending\t%d\t%s; %d in flight, %d waiting to retry, %d scheduled\n", s.Pending, oldest, s.InFlight, s.Retrying, s.Scheduled)
	fmt.Fprintf(tw, "published\t%d\tconfirmed, kept until cleanup (--retention; none with 0)\n", s.Published)
	fmt.Fprintf(tw, "failed\t%d\tdead-lettered\n", s.Failed)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.FailedByEventType) > 0 {
		fmt.Fprintln(w, "\nDead-lettered by event type:")
		tw = newTable(w)
		fmt.Fprintln(tw, "EVENT TYPE\tCOUNT")
		for _, f := range s.FailedByEventType {
			fmt.Fprintf(tw, "%s\t%d\n", cell(f.EventType, 60), f.Count)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if b := s.Blocked; b != nil {
		fmt.Fprintf(w, "\nBlocked aggregates: %d, %d events waiting behind them\n", b.Aggregates, b.Waiting)
		if len(b.First) > 0 {
			tw = newTable(w)
			fmt.Fprintln(tw, "KEY\tFAILED ID\tEVENT TYPE\tWAITING")
			for _, ag := range b.First {
				parts := make([]string, len(ag.Key))
				for i, k := range ag.Key {
					parts[i] = "NULL"
					if k != nil {
						parts[i] = *k
					}
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", cell(strings.Join(parts, "/"), 60), ag.FailedID, cell(ag.EventType, 30), ag.Waiting)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if more := b.Aggregates - int64(len(b.First)); more > 0 {
				fmt.Fprintf(w, "… and %d more\n", more)
			}
		}
	}
	return nil
}
