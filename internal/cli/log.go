package cli

import (
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"
)

// LogFlags shape the logs; a command embeds them.
type LogFlags struct {
	LogFormat string `name:"log-format" env:"OUTBOX_LOG_FORMAT" default:"auto" enum:"auto,text,json" help:"Log format: auto (colored text on a terminal, JSON otherwise), text or json."`
	LogLevel  string `name:"log-level" env:"OUTBOX_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Lowest level logged: debug, info, warn or error."`
}

// Logger is the logger the flags ask for, writing to w.
func (f LogFlags) Logger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(f.LogLevel)) // the enum already checked it
	format := f.LogFormat
	if format == "auto" {
		format = "json"
		if file, ok := w.(*os.File); ok && isatty.IsTerminal(file.Fd()) {
			format = "text"
		}
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: readableDuration}))
	}
	return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly}))
}

// readableDuration writes a duration as Go prints it ("5s", "1.5ms")
// rather than as slog's JSON default, an integer of nanoseconds that a
// reader of the logs has to divide.
func readableDuration(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
