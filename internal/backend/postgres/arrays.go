package postgres

import (
	"strconv"
	"strings"
	"time"
)

// Batches reach the server as array parameters. pgx would encode a Go
// slice element by element through an interface value, which allocates
// for nearly every element; instead each column is written as one
// PostgreSQL array literal ('{1,2,3}', '{"a","b"}') into a single string,
// which pgx sends as a text-format parameter and the server parses with
// the array type's input function (the query casts each parameter). A
// batch of thousands of rows then costs a handful of allocations.

// arrayLit builds one array literal.
type arrayLit struct {
	b strings.Builder
	n int
}

// init starts a literal with room for about size bytes.
func (a *arrayLit) init(size int) {
	a.b.Grow(size + 2)
	a.b.WriteByte('{')
}

func (a *arrayLit) sep() {
	if a.n > 0 {
		a.b.WriteByte(',')
	}
	a.n++
}

// int appends an integer element.
func (a *arrayLit) int(v int64) {
	a.sep()
	var scratch [24]byte
	a.b.Write(strconv.AppendInt(scratch[:0], v, 10))
}

// str appends a quoted text element, escaping '"' and '\'.
func (a *arrayLit) str(s string) {
	a.sep()
	a.b.WriteByte('"')
	for {
		i := strings.IndexAny(s, `"\`)
		if i < 0 {
			break
		}
		a.b.WriteString(s[:i])
		a.b.WriteByte('\\')
		a.b.WriteByte(s[i])
		s = s[i+1:]
	}
	a.b.WriteString(s)
	a.b.WriteByte('"')
}

// bytes appends a quoted element from raw bytes (JSON text).
func (a *arrayLit) bytes(s []byte) {
	a.sep()
	a.b.WriteByte('"')
	start := 0
	for i, c := range s {
		if c == '"' || c == '\\' {
			a.b.Write(s[start:i])
			a.b.WriteByte('\\')
			start = i
		}
	}
	a.b.Write(s[start:])
	a.b.WriteByte('"')
}

// time appends a timestamp element in RFC 3339 with nanoseconds (the
// server rounds to microseconds), or NULL for the zero time.
func (a *arrayLit) time(t time.Time) {
	a.sep()
	if t.IsZero() {
		a.b.WriteString("NULL")
		return
	}
	var scratch [48]byte
	a.b.WriteByte('"')
	a.b.Write(t.UTC().AppendFormat(scratch[:0], time.RFC3339Nano))
	a.b.WriteByte('"')
}

// bool appends a boolean element.
func (a *arrayLit) bool(v bool) {
	a.sep()
	if v {
		a.b.WriteByte('t')
	} else {
		a.b.WriteByte('f')
	}
}

// null appends a NULL element.
func (a *arrayLit) null() {
	a.sep()
	a.b.WriteString("NULL")
}

// String closes the literal and returns it.
func (a *arrayLit) String() string {
	a.b.WriteByte('}')
	return a.b.String()
}

// textArray returns ss as one text[] literal.
func textArray(ss []string) string {
	var a arrayLit
	a.init(16 * len(ss))
	for _, s := range ss {
		a.str(s)
	}
	return a.String()
}
