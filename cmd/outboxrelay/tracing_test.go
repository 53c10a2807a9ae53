package main_test

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// otlpReceiver is an OTLP/HTTP trace endpoint that hands over every span
// it receives.
func otlpReceiver(t *testing.T) (string, <-chan *tracepb.Span) {
	t.Helper()
	spans := make(chan *tracepb.Span, 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req collector.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					spans <- s
				}
			}
		}
		resp, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = io.Copy(w, bytes.NewReader(resp))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, spans
}

// TestRelayExportsProducerSpansThroughOTLP configures tracing through the
// standard environment only: the relay exports a PRODUCER span per
// message, a child of the traceparent the producer wrote in the event's
// headers, and the consumer receives the span's own context.
func TestRelayExportsProducerSpansThroughOTLP(t *testing.T) {
	t.Parallel()
	endpoint, spans := otlpReceiver(t)
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	startRelay(t, relayEnv(dbURL, exchange, "OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint,
		"OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_SERVICE_NAME=relay-under-test"))

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', '1', 'created', '{}', jsonb_build_object('traceparent', $1::text))`,
		"00-"+traceID+"-"+parentID+"-01")
	d := queue.Receive(t, 1, 30*time.Second)[0]

	var span *tracepb.Span
	select {
	case span = <-spans:
	case <-time.After(30 * time.Second):
		t.Fatal("no span exported within 30s")
	}
	require.Equal(t, tracepb.Span_SPAN_KIND_PRODUCER, span.GetKind())
	require.Equal(t, "publish "+exchange+":order.created", span.GetName())
	require.Equal(t, traceID, hex.EncodeToString(span.GetTraceId()), "the producer's trace")
	require.Equal(t, parentID, hex.EncodeToString(span.GetParentSpanId()), "a child of the producer's span")
	attrs := map[string]string{}
	for _, kv := range span.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	require.Equal(t, "rabbitmq", attrs["messaging.system"])
	require.Equal(t, d.MessageId, attrs["messaging.message.id"])
	require.Equal(t, "00-"+traceID+"-"+hex.EncodeToString(span.GetSpanId())+"-01", d.Headers["traceparent"],
		"the consumer continues from the publish span")
}
