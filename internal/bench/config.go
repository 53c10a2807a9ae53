package bench

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Workloads, the values of Config.Only, in the order Run runs them.
const (
	WorkloadDrain     = "drain"
	WorkloadSteady    = "steady"
	WorkloadIdle      = "idle"
	WorkloadProducer  = "producer"
	WorkloadOrdered   = "ordered"
	WorkloadScale     = "scale"
	WorkloadScheduled = "scheduled"
	WorkloadHorizon   = "horizon"
	WorkloadEarlyIDs  = "early-ids"
	WorkloadBursts    = "bursts"
	WorkloadSteps     = "steps"
)

// Systems a workload runs on.
const (
	SystemRelay   = "relay"   // outboxrelay run, as a subprocess
	SystemNaive   = "naive"   // outboxrelay-bench naive-relay, as a subprocess
	SystemCeiling = "ceiling" // the benchmark publishing straight to RabbitMQ
	// SystemKeyscan is the ordered relay (outboxrelay run
	// --ordering=aggregate), named after the way its claims find
	// claimable aggregates, a loose index scan, as in earlier results.
	SystemKeyscan = "keyscan"
)

// Workloads lists every workload in the order Run runs them.
var workloads = []string{WorkloadDrain, WorkloadSteady, WorkloadIdle, WorkloadProducer, WorkloadOrdered, WorkloadScale, WorkloadScheduled, WorkloadEarlyIDs, WorkloadBursts, WorkloadSteps, WorkloadHorizon}

// defaultWorkloads are those Run runs when Config.Only is empty: all but
// horizon, which takes about 14 minutes with its defaults.
var defaultWorkloads = []string{WorkloadDrain, WorkloadSteady, WorkloadIdle, WorkloadProducer, WorkloadOrdered, WorkloadScale, WorkloadScheduled, WorkloadEarlyIDs, WorkloadBursts, WorkloadSteps}

// Phases of the horizon workload, the values of Result.Phase.
const (
	PhaseBefore = "before" // the baseline, before the horizon is pinned
	PhasePinned = "pinned" // while a REPEATABLE READ transaction pins it
	PhaseAfter  = "after"  // after that transaction has committed
)

// maxEventNumber is the largest event number the 12 hex digits of an event
// id can carry.
const maxEventNumber = 1<<48 - 1

// Config configures Run. Every field documents its default; zero means the
// default.
type Config struct {
	// DatabaseURL is the PostgreSQL database to work in, a postgres:// URL.
	// Default "postgres://postgres@localhost:5432/postgres".
	DatabaseURL string
	// AMQPURL is the RabbitMQ broker. Default "amqp://localhost:5672/".
	AMQPURL string
	// Schema is where the relay's migrations create the outbox table; it is
	// created (and marked as the benchmark's) if missing, and dropped
	// (CASCADE) at the end unless Keep. An existing schema the benchmark
	// did not create is refused. Default "outboxrelay_bench".
	Schema string
	// Exchange is the topic exchange everything is published to; it is
	// declared if missing and, if the benchmark declared it, deleted at the
	// end unless Keep. Default "outboxrelay_bench".
	Exchange string
	// Keep leaves the schema and the exchange in place. Default false.
	Keep bool
	// RelayBinary is the outboxrelay binary measured, run as "migrate" and
	// "run". Required.
	RelayBinary string
	// NaiveBinary is the binary run as "naive-relay", the naive poller:
	// outboxrelay-bench. Default: the running executable (os.Executable),
	// which must be outboxrelay-bench.
	NaiveBinary string
	// RelayArgs are appended to the relay's command line, for tuning
	// (e.g. "--batch-size=1000"). Default none.
	RelayArgs []string
	// Only selects workloads by name (drain, steady, idle, producer,
	// ordered, scale, scheduled, early-ids, bursts, steps, horizon). They always
	// run in that order. Default:
	// all but horizon (about 14 minutes with its defaults), which runs
	// only when named.
	Only []string
	// DrainEvents is the backlog the drain workload delivers. Default 100000.
	DrainEvents int
	// PayloadBytes is the approximate size of each event's JSON payload.
	// Default 256.
	PayloadBytes int
	// NaiveDrainTime is how long the naive poller drains before its rate is
	// taken. Default 10s.
	NaiveDrainTime time.Duration
	// SteadyRates are the steady workload's target commit rates, events per
	// second. Default [1000, 5000].
	SteadyRates []int
	// SteadyDuration is how long producers write at each steady rate.
	// Default 60s.
	SteadyDuration time.Duration
	// Producers is how many connections share a steady rate. Default 8.
	Producers int
	// IdleEvents is how many events the idle workload writes. Default 50.
	IdleEvents int
	// IdleInterval is the time between idle events. Default 200ms.
	IdleInterval time.Duration
	// ProducerConcurrency are the connection counts of the producer
	// workload. Default [1, 8, 32].
	ProducerConcurrency []int
	// ProducerDuration is how long each producer run inserts. Default 5s.
	ProducerDuration time.Duration
	// ProducerPairs is how many times the producer workload runs each
	// connection count with the triggers enabled and then disabled, the
	// runs interleaved. Default 2.
	ProducerPairs int
	// OrderedShapes are the ordered workload's backlogs, each drained by
	// the relay, then by the ordered relay. Default 1000x50, 100000x1,
	// 1x10000.
	OrderedShapes []Shape
	// OrderedSteadyRate is the ordered workload's steady commit rate,
	// events per second, written by Producers connections for
	// SteadyDuration. Default 1000.
	OrderedSteadyRate int
	// OrderedSteadyAggregates is how many aggregates the ordered steady
	// events are spread over; a multiple of Producers, so each aggregate
	// has one producer. Default 1000.
	OrderedSteadyAggregates int
	// ScaleRelays are the relay counts the scale workload drains
	// DrainEvents with, side by side on one table. Default [1, 2, 3].
	ScaleRelays []int
	// EarlyIDsRate is the early-ids workload's commit rate, events per
	// second, written by four sessions whose id sequence hands out ids
	// in blocks of 50. Default 1000.
	EarlyIDsRate int
	// EarlyIDsDuration is how long the early-ids producers write. Default
	// 30s.
	EarlyIDsDuration time.Duration
	// BurstPairs is how many times the bursts workload runs a burst with
	// the outbox's triggers enabled and then one with them disabled.
	// Default 3.
	BurstPairs int
	// BurstRest is how long the relay rests, nothing inserted, before each
	// burst. Default 1s.
	BurstRest time.Duration
	// BurstDuration is how long each burst's producers insert as fast as
	// they can. Default 5s.
	BurstDuration time.Duration
	// BurstProducers is how many connections insert in a burst, one event
	// per transaction. Default 32.
	BurstProducers int
	// StepRates are the steps workload's commit rates, events per second,
	// each written by Producers connections for StepDuration, one after
	// the other without a break: up and down, then just under and over the
	// relay's default --busy-rate (1,000/s). Default [300, 1000, 3000, 300,
	// 900, 1100, 900, 1100].
	StepRates []int
	// StepDuration is how long each step lasts. Default 10s.
	StepDuration time.Duration
	// ScheduledEvents is how many events the scheduled workload writes in
	// one transaction, due one after another over ScheduledOver. Default
	// 10000.
	ScheduledEvents int
	// ScheduledOver is the time the scheduled events fall due over.
	// Default 60s.
	ScheduledOver time.Duration
	// HorizonRate is the horizon workload's commit rate, events per
	// second, written by Producers connections throughout its windows.
	// Default 1000.
	HorizonRate int
	// HorizonPinned is how long the horizon workload pins the horizon with
	// a REPEATABLE READ transaction, rounded up to whole windows of
	// HorizonWindow (so that its last pinned window, the one its ratios
	// take, is a whole one). Default 10m (14 windows of 45s, 10m30s).
	HorizonPinned time.Duration
	// HorizonWindow is the length of each window the horizon workload
	// measures. Default 45s.
	HorizonWindow time.Duration
	// HorizonBefore is how many windows the horizon workload measures
	// before the pin, its baseline. Default 2.
	HorizonBefore int
	// HorizonAfter is how many windows it measures after the pin ends.
	// Default 2.
	HorizonAfter int
	// HorizonAggregates is how many aggregates the horizon workload's
	// events are spread over, interleaved, as the ordered steady run's
	// are; a multiple of Producers. With --ordering=aggregate among
	// RelayArgs the relay runs ordered. Default 1000.
	HorizonAggregates int
	// DrainWait bounds every wait for events still on their way: after
	// steady and idle producers stop, between producer runs, and, as the
	// longest stretch without progress, during a drain. Default 60s.
	DrainWait time.Duration
	// Logger receives a progress line as each workload starts and ends.
	// Default: discarded.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.DatabaseURL = cmp.Or(c.DatabaseURL, "postgres://postgres@localhost:5432/postgres")
	c.AMQPURL = cmp.Or(c.AMQPURL, "amqp://localhost:5672/")
	c.Schema = cmp.Or(c.Schema, "outboxrelay_bench")
	c.Exchange = cmp.Or(c.Exchange, "outboxrelay_bench")
	if c.NaiveBinary == "" {
		if exe, err := os.Executable(); err == nil {
			c.NaiveBinary = exe
		}
	}
	if len(c.Only) == 0 {
		c.Only = defaultWorkloads
	}
	c.DrainEvents = cmp.Or(c.DrainEvents, 100000)
	c.PayloadBytes = cmp.Or(c.PayloadBytes, 256)
	c.NaiveDrainTime = cmp.Or(c.NaiveDrainTime, 10*time.Second)
	if len(c.SteadyRates) == 0 {
		c.SteadyRates = []int{1000, 5000}
	}
	c.SteadyDuration = cmp.Or(c.SteadyDuration, time.Minute)
	c.Producers = cmp.Or(c.Producers, 8)
	c.IdleEvents = cmp.Or(c.IdleEvents, 50)
	c.IdleInterval = cmp.Or(c.IdleInterval, 200*time.Millisecond)
	if len(c.ProducerConcurrency) == 0 {
		c.ProducerConcurrency = []int{1, 8, 32}
	}
	c.ProducerDuration = cmp.Or(c.ProducerDuration, 5*time.Second)
	c.ProducerPairs = cmp.Or(c.ProducerPairs, 2)
	if len(c.OrderedShapes) == 0 {
		c.OrderedShapes = []Shape{{1000, 50}, {100000, 1}, {1, 10000}}
	}
	c.OrderedSteadyRate = cmp.Or(c.OrderedSteadyRate, 1000)
	c.OrderedSteadyAggregates = cmp.Or(c.OrderedSteadyAggregates, 1000)
	if len(c.ScaleRelays) == 0 {
		c.ScaleRelays = []int{1, 2, 3}
	}
	c.ScheduledEvents = cmp.Or(c.ScheduledEvents, 10000)
	c.ScheduledOver = cmp.Or(c.ScheduledOver, time.Minute)
	c.EarlyIDsRate = cmp.Or(c.EarlyIDsRate, 1000)
	c.EarlyIDsDuration = cmp.Or(c.EarlyIDsDuration, 30*time.Second)
	c.BurstPairs = cmp.Or(c.BurstPairs, 3)
	c.BurstRest = cmp.Or(c.BurstRest, time.Second)
	c.BurstDuration = cmp.Or(c.BurstDuration, 5*time.Second)
	c.BurstProducers = cmp.Or(c.BurstProducers, 32)
	if len(c.StepRates) == 0 {
		c.StepRates = []int{300, 1000, 3000, 300, 900, 1100, 900, 1100}
	}
	c.StepDuration = cmp.Or(c.StepDuration, 10*time.Second)
	c.HorizonRate = cmp.Or(c.HorizonRate, 1000)
	c.HorizonPinned = cmp.Or(c.HorizonPinned, 10*time.Minute)
	c.HorizonWindow = cmp.Or(c.HorizonWindow, 45*time.Second)
	c.HorizonBefore = cmp.Or(c.HorizonBefore, 2)
	c.HorizonAfter = cmp.Or(c.HorizonAfter, 2)
	c.HorizonAggregates = cmp.Or(c.HorizonAggregates, 1000)
	c.DrainWait = cmp.Or(c.DrainWait, 60*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate reports the first setting that cannot work, naming it. It never
// includes a password.
func (c Config) Validate() error {
	c = c.withDefaults()
	if u, err := url.Parse(c.DatabaseURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("bench: DatabaseURL: must be a postgres:// URL")
	}
	if u, err := url.Parse(c.AMQPURL); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
		return fmt.Errorf("bench: AMQPURL: must be an amqp:// or amqps:// URL")
	}
	for _, w := range c.Only {
		if !slices.Contains(workloads, w) {
			return fmt.Errorf("bench: Only %q: must be one of %s", w, strings.Join(workloads, ", "))
		}
	}
	if bad := firstBelow(c.SteadyRates, 1); bad != "" {
		return fmt.Errorf("bench: SteadyRates %s: must be at least 1", bad)
	}
	if bad := firstBelow(c.ProducerConcurrency, 1); bad != "" {
		return fmt.Errorf("bench: ProducerConcurrency %s: must be at least 1", bad)
	}
	if bad := firstBelow(c.ScaleRelays, 1); bad != "" {
		return fmt.Errorf("bench: ScaleRelays %s: must be at least 1", bad)
	}
	switch {
	case c.Schema == "" || len(c.Schema) > 63:
		return fmt.Errorf("bench: Schema %q: must be 1 to 63 bytes", c.Schema)
	case len(c.Exchange) > 255 || strings.HasPrefix(c.Exchange, "amq."):
		return fmt.Errorf("bench: Exchange %q: must be at most 255 bytes and not start with %q", c.Exchange, "amq.")
	case c.RelayBinary == "":
		return fmt.Errorf("bench: RelayBinary: must name the outboxrelay binary")
	case c.NaiveBinary == "":
		return fmt.Errorf("bench: NaiveBinary: must name the outboxrelay-bench binary")
	case c.DrainEvents < 1 || c.DrainEvents > maxEventNumber/4:
		return fmt.Errorf("bench: DrainEvents %d: must be between 1 and %d", c.DrainEvents, maxEventNumber/4)
	case c.PayloadBytes < 1:
		return fmt.Errorf("bench: PayloadBytes %d: must be at least 1", c.PayloadBytes)
	case c.NaiveDrainTime <= 0:
		return fmt.Errorf("bench: NaiveDrainTime %s: must be positive", c.NaiveDrainTime)
	case c.SteadyDuration <= 0:
		return fmt.Errorf("bench: SteadyDuration %s: must be positive", c.SteadyDuration)
	case c.Producers < 1:
		return fmt.Errorf("bench: Producers %d: must be at least 1", c.Producers)
	case c.IdleEvents < 1:
		return fmt.Errorf("bench: IdleEvents %d: must be at least 1", c.IdleEvents)
	case c.IdleInterval <= 0:
		return fmt.Errorf("bench: IdleInterval %s: must be positive", c.IdleInterval)
	case c.ProducerDuration <= 0:
		return fmt.Errorf("bench: ProducerDuration %s: must be positive", c.ProducerDuration)
	case c.ProducerPairs < 1:
		return fmt.Errorf("bench: ProducerPairs %d: must be at least 1", c.ProducerPairs)
	case c.DrainWait <= 0:
		return fmt.Errorf("bench: DrainWait %s: must be positive", c.DrainWait)
	case c.ScheduledEvents < 1 || c.ScheduledEvents > maxEventNumber/4:
		return fmt.Errorf("bench: ScheduledEvents %d: must be between 1 and %d", c.ScheduledEvents, maxEventNumber/4)
	case c.ScheduledOver <= 0:
		return fmt.Errorf("bench: ScheduledOver %s: must be positive", c.ScheduledOver)
	case c.EarlyIDsRate < 1:
		return fmt.Errorf("bench: EarlyIDsRate %d: must be at least 1", c.EarlyIDsRate)
	case c.EarlyIDsDuration <= 0:
		return fmt.Errorf("bench: EarlyIDsDuration %s: must be positive", c.EarlyIDsDuration)
	case c.BurstPairs < 1:
		return fmt.Errorf("bench: BurstPairs %d: must be at least 1", c.BurstPairs)
	case c.BurstRest < 0:
		return fmt.Errorf("bench: BurstRest %s: must not be negative", c.BurstRest)
	case c.BurstDuration <= 0:
		return fmt.Errorf("bench: BurstDuration %s: must be positive", c.BurstDuration)
	case c.BurstProducers < 1:
		return fmt.Errorf("bench: BurstProducers %d: must be at least 1", c.BurstProducers)
	case c.StepDuration <= 0:
		return fmt.Errorf("bench: StepDuration %s: must be positive", c.StepDuration)
	}
	if bad := firstBelow(c.StepRates, 1); bad != "" {
		return fmt.Errorf("bench: StepRates %s: must be at least 1", bad)
	}
	var steps float64
	for _, rate := range c.StepRates {
		steps += float64(rate) * c.StepDuration.Seconds()
	}
	if steps > maxEventNumber/4 {
		return fmt.Errorf("bench: StepRates over StepDuration %s: too many events", c.StepDuration)
	}
	for _, rate := range c.SteadyRates {
		if events := float64(rate) * c.SteadyDuration.Seconds(); events > maxEventNumber/4 {
			return fmt.Errorf("bench: SteadyRates %d over SteadyDuration %s: too many events", rate, c.SteadyDuration)
		}
	}
	if err := c.validateOrdered(); err != nil {
		return err
	}
	return c.validateHorizon()
}

// validateHorizon checks the horizon workload's settings (that its
// aggregates fit Producers only when it runs).
func (c Config) validateHorizon() error {
	switch {
	case c.HorizonRate < 1:
		return fmt.Errorf("bench: HorizonRate %d: must be at least 1", c.HorizonRate)
	case c.HorizonPinned <= 0:
		return fmt.Errorf("bench: HorizonPinned %s: must be positive", c.HorizonPinned)
	case c.HorizonWindow <= 0:
		return fmt.Errorf("bench: HorizonWindow %s: must be positive", c.HorizonWindow)
	case c.HorizonBefore < 1:
		return fmt.Errorf("bench: HorizonBefore %d: must be at least 1", c.HorizonBefore)
	case c.HorizonAfter < 1:
		return fmt.Errorf("bench: HorizonAfter %d: must be at least 1", c.HorizonAfter)
	case float64(c.HorizonRate)*c.horizonSpan().Seconds() > maxEventNumber/4:
		return fmt.Errorf("bench: HorizonRate %d over %s of windows: too many events", c.HorizonRate, c.horizonSpan())
	case c.HorizonAggregates < 1 || (c.runs(WorkloadHorizon) && c.HorizonAggregates%c.Producers != 0):
		return fmt.Errorf("bench: HorizonAggregates %d: must be a multiple of Producers (%d), so that each aggregate has one producer", c.HorizonAggregates, c.Producers)
	}
	return nil
}

// horizonPinnedWindows is how many windows the pin lasts: HorizonPinned
// in windows of HorizonWindow, rounded up.
func (c Config) horizonPinnedWindows() int {
	return int((c.HorizonPinned + c.HorizonWindow - 1) / c.HorizonWindow)
}

// horizonSpan is the horizon workload's windows end to end.
func (c Config) horizonSpan() time.Duration {
	return time.Duration(c.HorizonBefore+c.horizonPinnedWindows()+c.HorizonAfter) * c.HorizonWindow
}

// validateOrdered checks the ordered workload's settings (that its steady
// aggregates fit Producers only when it runs).
func (c Config) validateOrdered() error {
	for _, s := range c.OrderedShapes {
		if s.Aggregates < 1 || s.Events < 1 || float64(s.Aggregates)*float64(s.Events) > maxEventNumber/4 {
			return fmt.Errorf("bench: OrderedShapes %s: want at least one aggregate of at least one event, at most %d events", s, maxEventNumber/4)
		}
	}
	switch {
	case c.OrderedSteadyRate < 1:
		return fmt.Errorf("bench: OrderedSteadyRate %d: must be at least 1", c.OrderedSteadyRate)
	case float64(c.OrderedSteadyRate)*c.SteadyDuration.Seconds() > maxEventNumber/4:
		return fmt.Errorf("bench: OrderedSteadyRate %d over SteadyDuration %s: too many events", c.OrderedSteadyRate, c.SteadyDuration)
	case c.OrderedSteadyAggregates < 1 || (c.runs(WorkloadOrdered) && c.OrderedSteadyAggregates%c.Producers != 0):
		return fmt.Errorf("bench: OrderedSteadyAggregates %d: must be a multiple of Producers (%d), so that each aggregate has one producer", c.OrderedSteadyAggregates, c.Producers)
	}
	return nil
}

// runs reports whether workload w is selected.
func (c Config) runs(w string) bool { return slices.Contains(c.Only, w) }

// Flags lists the settings as the bench command's flags, for the report.
func (c Config) Flags() []string {
	c = c.withDefaults()
	flags := []string{
		"--schema=" + c.Schema,
		"--exchange=" + c.Exchange,
		"--only=" + strings.Join(c.Only, ","),
		"--drain-events=" + strconv.Itoa(c.DrainEvents),
		"--payload-bytes=" + strconv.Itoa(c.PayloadBytes),
		"--naive-drain-time=" + c.NaiveDrainTime.String(),
		"--steady-rates=" + joinInts(c.SteadyRates),
		"--steady-duration=" + c.SteadyDuration.String(),
		"--producers=" + strconv.Itoa(c.Producers),
		"--idle-events=" + strconv.Itoa(c.IdleEvents),
		"--idle-interval=" + c.IdleInterval.String(),
		"--producer-concurrency=" + joinInts(c.ProducerConcurrency),
		"--producer-duration=" + c.ProducerDuration.String(),
		"--producer-pairs=" + strconv.Itoa(c.ProducerPairs),
		"--ordered-shapes=" + joinShapes(c.OrderedShapes),
		"--ordered-steady-rate=" + strconv.Itoa(c.OrderedSteadyRate),
		"--ordered-steady-aggregates=" + strconv.Itoa(c.OrderedSteadyAggregates),
		"--scale-relays=" + joinInts(c.ScaleRelays),
		"--scheduled-events=" + strconv.Itoa(c.ScheduledEvents),
		"--scheduled-over=" + c.ScheduledOver.String(),
		"--early-ids-rate=" + strconv.Itoa(c.EarlyIDsRate),
		"--early-ids-duration=" + c.EarlyIDsDuration.String(),
		"--burst-pairs=" + strconv.Itoa(c.BurstPairs),
		"--burst-rest=" + c.BurstRest.String(),
		"--burst-duration=" + c.BurstDuration.String(),
		"--burst-producers=" + strconv.Itoa(c.BurstProducers),
		"--step-rates=" + joinInts(c.StepRates),
		"--step-duration=" + c.StepDuration.String(),
		"--horizon-rate=" + strconv.Itoa(c.HorizonRate),
		"--horizon-pinned=" + c.HorizonPinned.String(),
		"--horizon-window=" + c.HorizonWindow.String(),
		"--horizon-before=" + strconv.Itoa(c.HorizonBefore),
		"--horizon-after=" + strconv.Itoa(c.HorizonAfter),
		"--horizon-aggregates=" + strconv.Itoa(c.HorizonAggregates),
		"--drain-wait=" + c.DrainWait.String(),
	}
	for _, a := range c.RelayArgs {
		flags = append(flags, "--relay-arg="+a)
	}
	if c.Keep {
		flags = append(flags, "--keep")
	}
	return flags
}

// relayBusyPoll is the relay's --busy-poll-interval default.
const relayBusyPoll = 2 * time.Millisecond

// busyPoll is the relay's busy poll interval: what RelayArgs set, else its
// default.
func (c Config) busyPoll() time.Duration {
	if v, ok := relayArg(c.RelayArgs, "--busy-poll-interval"); ok {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
	}
	return relayBusyPoll
}

func firstBelow(xs []int, low int) string {
	for _, x := range xs {
		if x < low {
			return strconv.Itoa(x)
		}
	}
	return ""
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func joinShapes(shapes []Shape) string {
	s := make([]string, len(shapes))
	for i, sh := range shapes {
		s[i] = sh.String()
	}
	return strings.Join(s, ",")
}
