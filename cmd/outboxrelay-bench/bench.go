package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/bench"
	"github.com/outboxrelay/outboxrelay/internal/cli"
)

// BenchCmd benchmarks the relay against a naive poller and the broker's
// ceiling, and the ordered relay against the relay; see package bench.
type BenchCmd struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" default:"postgres://postgres@localhost:5432/postgres" help:"PostgreSQL database to benchmark in."`
	AMQPURL     string `name:"amqp-url" env:"AMQP_URL" default:"amqp://localhost:5672/" help:"RabbitMQ URL (no credentials means guest/guest)."`
	cli.LogFlags
	RelayBinary string `name:"relay-binary" placeholder:"PATH" help:"The outboxrelay binary to measure. Default: the outboxrelay next to this executable, else the one in PATH."`

	Schema   string   `name:"schema" default:"outboxrelay_bench" help:"Schema the outbox is created in; dropped at the end unless --keep. An existing schema the benchmark did not create is refused."`
	Exchange string   `name:"exchange" default:"outboxrelay_bench" help:"Topic exchange events go to; deleted at the end unless --keep, if the benchmark created it."`
	Keep     bool     `name:"keep" help:"Keep the schema and the exchange."`
	JSON     string   `name:"json" default:"bench.jsonl" help:"Append the results to this file as JSON lines; empty disables."`
	Only     []string `name:"only" default:"drain,steady,idle,producer,ordered,scale,scheduled,early-ids,bursts,steps" help:"Workloads to run: drain, steady, idle, producer, ordered, scale, scheduled, early-ids, bursts, steps, horizon (not by default: about 14 minutes with its defaults)."`
	RelayArg []string `name:"relay-arg" sep:"none" help:"Extra argument for the relay's command line, repeatable (e.g. --relay-arg=--batch-size=1000)."`

	DrainEvents      int           `name:"drain-events" default:"100000" group:"Workloads" help:"Backlog the drain workload delivers."`
	PayloadBytes     int           `name:"payload-bytes" default:"256" group:"Workloads" help:"Approximate size of each event's JSON payload."`
	NaiveDrainTime   time.Duration `name:"naive-drain-time" default:"10s" group:"Workloads" help:"How long the naive poller drains."`
	SteadyRates      []int         `name:"steady-rates" default:"1000,5000" group:"Workloads" help:"Steady workload target rates, events/s."`
	SteadyDuration   time.Duration `name:"steady-duration" default:"60s" group:"Workloads" help:"How long producers write at each steady rate."`
	Producers        int           `name:"producers" default:"8" group:"Workloads" help:"Producer connections sharing a steady rate."`
	IdleEvents       int           `name:"idle-events" default:"50" group:"Workloads" help:"Events the idle workload writes."`
	IdleInterval     time.Duration `name:"idle-interval" default:"200ms" group:"Workloads" help:"Time between idle events."`
	ProducerConc     []int         `name:"producer-concurrency" default:"1,8,32" group:"Workloads" help:"Connection counts of the producer workload."`
	ProducerDur      time.Duration `name:"producer-duration" default:"5s" group:"Workloads" help:"How long each producer run inserts."`
	ProducerPairs    int           `name:"producer-pairs" default:"2" group:"Workloads" help:"Times each producer connection count runs with the triggers on, then off."`
	ScaleRelays      []int         `name:"scale-relays" default:"1,2,3" group:"Workloads" help:"Relay counts the scale workload drains --drain-events with, side by side."`
	ScheduledEvents  int           `name:"scheduled-events" default:"10000" group:"Workloads" help:"Events the scheduled workload writes in one transaction, due one after another over --scheduled-over, to a relay polling every hour."`
	ScheduledOver    time.Duration `name:"scheduled-over" default:"60s" group:"Workloads" help:"Time the scheduled events fall due over, from 2 s after their write."`
	EarlyIDsRate     int           `name:"early-ids-rate" default:"1000" group:"Workloads" help:"Commit rate of the early-ids workload: four sessions whose id sequence hands out ids in blocks of 50."`
	EarlyIDsDuration time.Duration `name:"early-ids-duration" default:"30s" group:"Workloads" help:"How long the early-ids producers write."`
	BurstPairs       int           `name:"burst-pairs" default:"3" group:"Workloads" help:"Times the bursts workload runs a burst with the triggers enabled, then one with them disabled."`
	BurstRest        time.Duration `name:"burst-rest" default:"1s" group:"Workloads" help:"How long the relay rests before each burst."`
	BurstDuration    time.Duration `name:"burst-duration" default:"5s" group:"Workloads" help:"How long each burst's producers insert as fast as they can."`
	BurstProducers   int           `name:"burst-producers" default:"32" group:"Workloads" help:"Connections inserting in a burst, one event per transaction."`
	StepRates        []int         `name:"step-rates" default:"300,1000,3000,300,900,1100,900,1100" group:"Workloads" help:"Commit rates of the steps workload, events/s, one after the other over --producers connections."`
	StepDuration     time.Duration `name:"step-duration" default:"10s" group:"Workloads" help:"How long each step lasts."`
	DrainWait        time.Duration `name:"drain-wait" default:"60s" group:"Workloads" help:"Longest wait for events still on their way."`

	OrderedShapes     []bench.Shape `name:"ordered-shapes" default:"1000x50,100000x1,1x10000" group:"Ordered workload" help:"Backlogs the ordered workload drains, <aggregates>x<events per aggregate>."`
	OrderedSteadyRate int           `name:"ordered-steady-rate" default:"1000" group:"Ordered workload" help:"Ordered steady rate, events/s, for --steady-duration over --producers connections."`
	OrderedSteadyAggs int           `name:"ordered-steady-aggregates" default:"1000" group:"Ordered workload" help:"Aggregates the ordered steady events are spread over (a multiple of --producers)."`

	HorizonRate   int           `name:"horizon-rate" default:"1000" group:"Horizon workload" help:"Events/s the horizon workload's --producers connections write throughout."`
	HorizonPinned time.Duration `name:"horizon-pinned" default:"10m" group:"Horizon workload" help:"How long a REPEATABLE READ transaction pins the horizon, rounded up to whole windows."`
	HorizonWindow time.Duration `name:"horizon-window" default:"45s" group:"Horizon workload" help:"Length of each measured window (a row each)."`
	HorizonBefore int           `name:"horizon-before" default:"2" group:"Horizon workload" help:"Windows measured before the pin, the baseline."`
	HorizonAfter  int           `name:"horizon-after" default:"2" group:"Horizon workload" help:"Windows measured after the pin ends."`
	HorizonAggs   int           `name:"horizon-aggregates" default:"1000" group:"Horizon workload" help:"Aggregates the horizon events are spread over (a multiple of --producers); --relay-arg=--ordering=aggregate measures ordered mode."`
}

func (c *BenchCmd) config(relay string, stderr io.Writer) bench.Config {
	return bench.Config{
		RelayBinary:         relay,
		DatabaseURL:         c.DatabaseURL,
		AMQPURL:             c.AMQPURL,
		Schema:              c.Schema,
		Exchange:            c.Exchange,
		Keep:                c.Keep,
		RelayArgs:           c.RelayArg,
		Only:                c.Only,
		DrainEvents:         c.DrainEvents,
		ScaleRelays:         c.ScaleRelays,
		ScheduledEvents:     c.ScheduledEvents,
		ScheduledOver:       c.ScheduledOver,
		EarlyIDsRate:        c.EarlyIDsRate,
		EarlyIDsDuration:    c.EarlyIDsDuration,
		BurstPairs:          c.BurstPairs,
		BurstRest:           c.BurstRest,
		BurstDuration:       c.BurstDuration,
		BurstProducers:      c.BurstProducers,
		StepRates:           c.StepRates,
		StepDuration:        c.StepDuration,
		PayloadBytes:        c.PayloadBytes,
		NaiveDrainTime:      c.NaiveDrainTime,
		SteadyRates:         c.SteadyRates,
		SteadyDuration:      c.SteadyDuration,
		Producers:           c.Producers,
		IdleEvents:          c.IdleEvents,
		IdleInterval:        c.IdleInterval,
		ProducerConcurrency: c.ProducerConc,
		ProducerDuration:    c.ProducerDur,
		ProducerPairs:       c.ProducerPairs,
		DrainWait:           c.DrainWait,
		Logger:              c.Logger(stderr),

		OrderedShapes:           c.OrderedShapes,
		OrderedSteadyRate:       c.OrderedSteadyRate,
		OrderedSteadyAggregates: c.OrderedSteadyAggs,

		HorizonRate:       c.HorizonRate,
		HorizonPinned:     c.HorizonPinned,
		HorizonWindow:     c.HorizonWindow,
		HorizonBefore:     c.HorizonBefore,
		HorizonAfter:      c.HorizonAfter,
		HorizonAggregates: c.HorizonAggs,
	}
}

// Run finds the relay, prints the machine, runs the benchmark, and prints
// and appends whatever results it got, even when a workload failed.
func (c *BenchCmd) Run(ctx context.Context, stdout, stderr io.Writer) error {
	relay, err := findRelay(c.RelayBinary)
	if err != nil {
		return err
	}
	cfg := c.config(relay, stderr)
	if err := cfg.Validate(); err != nil {
		return cli.Usage(err)
	}
	started := time.Now()
	machine, err := bench.Probe(ctx, cfg)
	if err != nil {
		return cli.Usage(err)
	}
	if err := bench.WriteMachine(stdout, machine, cfg); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	results, runErr := bench.Run(ctx, cfg)
	if len(results) == 0 {
		return runErr
	}
	ratios := bench.ComputeRatios(results)
	errs := []error{runErr, bench.WriteTable(stdout, results), bench.WriteRatios(stdout, ratios)}
	if c.JSON != "" {
		errs = append(errs, bench.AppendJSON(c.JSON, started, machine, cfg, results, ratios))
	}
	return errors.Join(errs...)
}

// findRelay is the outboxrelay binary to measure: flag if given (a path,
// or a name looked up in PATH), else the outboxrelay next to this
// executable, else the one in PATH.
func findRelay(flag string) (string, error) {
	if flag != "" {
		path, err := exec.LookPath(flag)
		if err != nil {
			return "", cli.Usagef("--relay-binary %s: %v", flag, err)
		}
		return filepath.Abs(path)
	}
	var beside string
	if exe, err := os.Executable(); err == nil {
		beside = filepath.Join(filepath.Dir(exe), "outboxrelay")
		if path, err := exec.LookPath(beside); err == nil {
			return path, nil
		}
	}
	if path, err := exec.LookPath("outboxrelay"); err == nil {
		return filepath.Abs(path)
	}
	where := "in PATH"
	if beside != "" {
		where = "at " + beside + " or in PATH"
	}
	return "", cli.Usagef("no outboxrelay binary %s: give the relay to measure with --relay-binary", where)
}

// NaiveRelayCmd runs the naive poller the benchmark compares the relay
// with (hidden: it is not for production).
type NaiveRelayCmd struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" default:"postgres://postgres@localhost:5432/postgres" help:"PostgreSQL database whose search_path holds the outbox table."`
	AMQPURL     string `name:"amqp-url" env:"AMQP_URL" default:"amqp://localhost:5672/" help:"RabbitMQ URL."`
	Exchange    string `name:"exchange" env:"OUTBOX_EXCHANGE" default:"outbox" help:"Exchange every event is published to."`
	cli.LogFlags
	Interval time.Duration `name:"interval" default:"1s" help:"Time between polls."`
	Limit    int           `name:"limit" default:"50" help:"Most rows one poll takes."`
}

// Run polls until ctx ends.
func (c *NaiveRelayCmd) Run(ctx context.Context, stderr io.Writer) error {
	cfg := bench.NaiveConfig{
		DatabaseURL: c.DatabaseURL,
		AMQPURL:     c.AMQPURL,
		Exchange:    c.Exchange,
		Interval:    c.Interval,
		Limit:       c.Limit,
		Logger:      c.Logger(stderr),
	}
	if err := cfg.Validate(); err != nil {
		return cli.Usage(err)
	}
	return bench.RunNaive(ctx, cfg)
}
