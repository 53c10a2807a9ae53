# The relay as a small static image: docker compose builds it from here.
FROM golang:1.26 AS build
WORKDIR /src
# The repository is a workspace of three modules (go.work): the relay and
# the two libraries it requires, built from their folders.
COPY go.work go.work.sum go.mod go.sum ./
COPY outbox/go.mod outbox/go.sum ./outbox/
COPY inbox/go.mod inbox/go.sum ./inbox/
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /outboxrelay ./cmd/outboxrelay

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /outboxrelay /outboxrelay
# /metrics, /livez and /readyz (--http-addr)
EXPOSE 9464
ENTRYPOINT ["/outboxrelay"]
CMD ["run"]
