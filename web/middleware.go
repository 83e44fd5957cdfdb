package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// statusWriter records the status and size of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// liveHeader marks the dashboard's live refreshes: the polls of its
// script (app.js), which every open page sends every few seconds.
const liveHeader = "X-Conveyor-Refresh"

// accessLevel is the level of a request's access log line: Debug for a
// live refresh that succeeded (a GET with liveHeader answered below 400),
// so that an open dashboard does not fill the log; Info for everything
// else. The header is the client's say-so, so it lowers only reads that
// succeeded: a refused or failed request, or any state change, is logged
// at Info whatever it claims.
func accessLevel(r *http.Request, status int) slog.Level {
	if r.Method == http.MethodGet && status < 400 && r.Header.Get(liveHeader) == "live" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// accessLog logs one line per request: method, path (without the query,
// which may hold search text), status, size, duration, remote address and
// who made it; at the level accessLevel says.
func (h *Handler) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r, ri := withReqInfo(r)
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		h.opts.Logger.LogAttrs(r.Context(), accessLevel(r, sw.status), "conveyor web",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.status), slog.Int64("bytes", sw.bytes),
			slog.Duration("duration", time.Since(start)),
			slog.String("remote", r.RemoteAddr), slog.String("who", ri.who))
	})
}

// contentSecurityPolicy allows the dashboard's own scripts and styles only:
// no inline script, no eval, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// securityHeaders sets the headers every response carries.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", contentSecurityPolicy)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// limits caps the request body and bounds the request's time: its context
// ends after RequestTimeout (plus MaxClaimWait for a claim, which may
// long-poll).
func (h *Handler) limits(next http.Handler) http.Handler {
	claim := h.opts.BasePath + "/api/v1/claim"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes)
		}
		d := h.opts.RequestTimeout
		if r.URL.Path == claim {
			d += h.opts.MaxClaimWait
		}
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// apiError is the body of every error the API returns.
type apiError struct {
	// Error is one sentence saying what went wrong.
	Error string `json:"error"`
}

// writeJSON writes v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true) // job data never reaches a page as markup, even if a browser sniffs
	_ = enc.Encode(v)
}

// writeError writes {"error": msg} with status.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Error: msg})
}

// bodyStatus is the status for an error reading a request body: 413 when
// it went over the cap, else 400.
func bodyStatus(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// decode reads exactly one JSON value into v. Unknown fields, trailing
// data and bodies over the cap are refused; on error it has written the
// answer (400 or 413, one message) and returns false.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: send application/json", ct))
		return false
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			err = errors.New("unexpected data after the JSON value")
			var mbe *http.MaxBytesError
			if errors.As(extra, &mbe) {
				err = extra
			}
		}
	}
	if err == nil {
		return true
	}
	status := bodyStatus(err)
	switch {
	case status == http.StatusRequestEntityTooLarge:
		writeError(w, status, fmt.Sprintf("request body over the %d-byte limit", h.opts.MaxBodyBytes))
	case errors.Is(err, io.EOF):
		writeError(w, status, "malformed JSON: empty body")
	default:
		writeError(w, status, "malformed JSON: "+err.Error())
	}
	return false
}
