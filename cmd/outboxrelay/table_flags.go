package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/cli"
)

// TableFlags name the outbox table, its columns and status values, and its
// ordering: what every command that reads or writes the table shares.
type TableFlags struct {
	Table string `name:"table" env:"OUTBOX_TABLE" default:"outbox" help:"Outbox table, optionally schema-qualified (schema.table)."`

	Ordering          string `name:"ordering" env:"OUTBOX_ORDERING" default:"none" enum:"none,aggregate" help:"none: events go out oldest first, in parallel; aggregate: each aggregate's events go out in insert order (relay_seq), one unconfirmed event per aggregate at a time (see docs/guarantees.md)."`
	OrderingKey       string `name:"ordering-key" env:"OUTBOX_ORDERING_KEY" help:"Comma-separated columns identifying an aggregate in ordered mode (default: the aggregate type and id columns)."`
	OrderedDeadLetter string `name:"ordered-dead-letter" env:"OUTBOX_ORDERED_DEAD_LETTER" default:"block" enum:"block,continue" help:"In ordered mode, what a dead-lettered event does to its aggregate: block (its later events wait until it is requeued or deleted) or continue."`

	ColumnID            string `name:"column-id" env:"OUTBOX_COLUMN_ID" default:"id" group:"Column mapping (existing tables)" help:"Integer column identifying a row (its ids may come from anywhere: claims follow relay_seq)."`
	ColumnEventID       string `name:"column-event-id" env:"OUTBOX_COLUMN_EVENT_ID" default:"event_id" group:"Column mapping (existing tables)" help:"Column sent as the AMQP message id."`
	ColumnAggregateType string `name:"column-aggregate-type" env:"OUTBOX_COLUMN_AGGREGATE_TYPE" default:"aggregate_type" group:"Column mapping (existing tables)" help:"Aggregate type column."`
	ColumnAggregateID   string `name:"column-aggregate-id" env:"OUTBOX_COLUMN_AGGREGATE_ID" default:"aggregate_id" group:"Column mapping (existing tables)" help:"Aggregate id column."`
	ColumnEventType     string `name:"column-event-type" env:"OUTBOX_COLUMN_EVENT_TYPE" default:"event_type" group:"Column mapping (existing tables)" help:"Event type column."`
	ColumnPayload       string `name:"column-payload" env:"OUTBOX_COLUMN_PAYLOAD" default:"payload" group:"Column mapping (existing tables)" help:"Payload column (the message body)."`
	ColumnStatus        string `name:"column-status" env:"OUTBOX_COLUMN_STATUS" default:"status" group:"Column mapping (existing tables)" help:"Status column."`
	ColumnCreatedAt     string `name:"column-created-at" env:"OUTBOX_COLUMN_CREATED_AT" default:"created_at" group:"Column mapping (existing tables)" help:"Creation time column (the AMQP timestamp)."`
	StatusPending       string `name:"status-pending" env:"OUTBOX_STATUS_PENDING" default:"pending" group:"Column mapping (existing tables)" help:"Status value of events waiting to be published."`
	StatusPublished     string `name:"status-published" env:"OUTBOX_STATUS_PUBLISHED" default:"published" group:"Column mapping (existing tables)" help:"Status value of published events."`
	StatusFailed        string `name:"status-failed" env:"OUTBOX_STATUS_FAILED" default:"failed" group:"Column mapping (existing tables)" help:"Status value of dead-lettered events."`
}

// claimConfig returns the table's part of the claim configuration, checked.
func (c TableFlags) claimConfig() (claim.Config, error) {
	cc := claim.Config{
		Table: c.Table,
		Columns: claim.Columns{
			ID: c.ColumnID, EventID: c.ColumnEventID, AggregateType: c.ColumnAggregateType,
			AggregateID: c.ColumnAggregateID, EventType: c.ColumnEventType, Payload: c.ColumnPayload,
			Status: c.ColumnStatus, CreatedAt: c.ColumnCreatedAt,
		},
		Statuses:          claim.Statuses{Pending: c.StatusPending, Published: c.StatusPublished, Failed: c.StatusFailed},
		Ordering:          claim.Ordering(c.Ordering),
		OrderedDeadLetter: claim.DeadLetterPolicy(c.OrderedDeadLetter),
	}
	if c.OrderingKey != "" {
		for _, col := range strings.Split(c.OrderingKey, ",") {
			cc.OrderingKey = append(cc.OrderingKey, strings.TrimSpace(col))
		}
	}
	if err := cc.Validate(); err != nil {
		if cerr := (*claim.ConfigError)(nil); errors.As(err, &cerr) && cerr.Setting == "OrderingKey" {
			err = fmt.Errorf("--ordering-key / OUTBOX_ORDERING_KEY: %w", err)
		}
		return claim.Config{}, cli.Usage(err)
	}
	return cc, nil
}
