package health

import (
	"encoding/json"
	"net/http"
)

// ReadyHandler serves /readyz: 200 with {"ready":true} while every check
// passed in the last round, else 503 with the failing checks and a reason.
func (m *Monitor) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := m.Status()
		code := http.StatusOK
		if !st.Ready {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, st)
	})
}

// LiveHandler serves /livez: 200 while live reports true (the relay's
// loops run), else 503. It checks no outside service.
func LiveHandler(live func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if live() {
			writeJSON(w, http.StatusOK, map[string]any{"live": true})
			return
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"live": false, "reason": "the relay's loops are not running"})
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
