// Package sqlq loads a backend's SQL from embedded .sql files: named queries
// (blocks headed by "-- name: NAME") and numbered migrations
// (migrations/NNN_description.sql). The token {p} in any SQL is replaced by
// the configured table prefix.
package sqlq

import (
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// prefixRE is the documented pattern for table prefixes.
var prefixRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,30}$`)

// CheckPrefix validates a table prefix: lower-case letters, digits and
// underscores, starting with a letter, at most 31 characters.
func CheckPrefix(p string) error {
	if !prefixRE.MatchString(p) {
		return fmt.Errorf("conveyor: invalid table prefix %q: must match %s", p, prefixRE)
	}
	return nil
}

// Load fills dst, a pointer to a struct of string fields each tagged
// `sql:"name"`, with the queries of the given files of fsys ({p}
// replaced by prefix). Every backend loads its queries this way, so that
// a query that is missing from the files, named twice, or present in a
// file with no field to receive it, fails when the driver opens, not when
// the statement is first run.
func Load(dst any, fsys fs.FS, prefix string, files ...string) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("sqlq: Load: %T is not a pointer to a struct", dst)
	}
	all := map[string]string{}
	from := map[string]string{}
	for _, f := range files {
		qs, err := parse(fsys, f, prefix)
		if err != nil {
			return err
		}
		for name, q := range qs {
			if prev, dup := from[name]; dup {
				return fmt.Errorf("sqlq: query %q is in both %s and %s", name, prev, f)
			}
			all[name], from[name] = q, f
		}
	}
	var errs []error
	s, t := v.Elem(), v.Elem().Type()
	used := map[string]bool{}
	for i := range t.NumField() {
		name, ok := t.Field(i).Tag.Lookup("sql")
		if !ok {
			continue
		}
		if t.Field(i).Type.Kind() != reflect.String {
			errs = append(errs, fmt.Errorf("sqlq: field %s (query %q) is not a string", t.Field(i).Name, name))
			continue
		}
		if used[name] {
			errs = append(errs, fmt.Errorf("sqlq: query %q has two fields in %s", name, t))
			continue
		}
		q, ok := all[name]
		if !ok {
			errs = append(errs, fmt.Errorf("sqlq: query %q (field %s) is in none of %v", name, t.Field(i).Name, files))
			continue
		}
		used[name] = true
		s.Field(i).SetString(q)
	}
	for name := range all {
		if !used[name] {
			errs = append(errs, fmt.Errorf("sqlq: query %q of %s has no field tagged sql:%q in %s", name, from[name], name, t))
		}
	}
	return errors.Join(errs...)
}

// parse reads every "-- name: X" block of file, with {p} replaced.
func parse(fsys fs.FS, file, prefix string) (map[string]string, error) {
	b, err := fs.ReadFile(fsys, file)
	if err != nil {
		return nil, fmt.Errorf("sqlq: %s: %w", file, err)
	}
	out := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSpace(strings.ReplaceAll(body.String(), "{p}", prefix))
		}
		body.Reset()
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			flush()
			name = strings.TrimSpace(rest)
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("sqlq: %s: query %q is named twice", file, name)
			}
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	flush()
	return out, nil
}

// Migration is one numbered schema step.
type Migration struct {
	Version int
	Name    string
	// Statements are executed in order; files separate them with a line
	// holding only "-- split".
	Statements []string
}

// Migrations reads dir/NNN_name.sql files from fsys in version order.
func Migrations(fsys fs.FS, dir, prefix string) []Migration {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		panic(fmt.Sprintf("sqlq: %s: %v", dir, err))
	}
	var ms []Migration
	for _, e := range entries {
		n := e.Name()
		if !strings.HasSuffix(n, ".sql") {
			continue
		}
		num, rest, ok := strings.Cut(n, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic(fmt.Sprintf("sqlq: migration %s is not named NNN_name.sql", n))
		}
		b, err := fs.ReadFile(fsys, dir+"/"+n)
		if err != nil {
			panic(err)
		}
		var stmts []string
		for _, s := range strings.Split(string(b), "\n-- split\n") {
			s = strings.TrimSpace(strings.ReplaceAll(s, "{p}", prefix))
			if s != "" {
				stmts = append(stmts, s)
			}
		}
		ms = append(ms, Migration{Version: v, Name: strings.TrimSuffix(rest, ".sql"), Statements: stmts})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			panic(fmt.Sprintf("sqlq: migrations in %s are not numbered 1..n (found %d at %d)", dir, m.Version, i+1))
		}
	}
	return ms
}

// Rewrite replaces each query of dst, a struct filled by Load, with f of
// it: the backends expand their own tokens ({cols}, server-dependent
// clauses) once, when the driver opens.
func Rewrite(dst any, f func(string) string) {
	s := reflect.ValueOf(dst).Elem()
	for i := range s.NumField() {
		if _, ok := s.Type().Field(i).Tag.Lookup("sql"); ok {
			s.Field(i).SetString(f(s.Field(i).String()))
		}
	}
}
