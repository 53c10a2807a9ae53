# The relay as a small static image: docker compose builds it from here.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
# The producer library is a module of its own that go.mod replaces with
# ./outbox: its go.mod is part of the module graph.
COPY outbox/go.mod outbox/go.sum ./outbox/
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /outboxrelay ./cmd/outboxrelay

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /outboxrelay /outboxrelay
# /metrics, /livez and /readyz (--http-addr)
EXPOSE 9464
ENTRYPOINT ["/outboxrelay"]
CMD ["run"]
