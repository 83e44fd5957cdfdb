package sqlq

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	fsys := fstest.MapFS{
		"a.sql":   {Data: []byte("-- name: get_job\nSELECT * FROM {p}jobs WHERE id = ?\n\n-- name: count\nSELECT count(*) FROM {p}jobs\n")},
		"b.sql":   {Data: []byte("-- name: other\nSELECT 1\n")},
		"dup.sql": {Data: []byte("-- name: get_job\nSELECT 1\n-- name: get_job\nSELECT 2\n")},
	}
	var q struct {
		GetJob string `sql:"get_job"`
		Count  string `sql:"count"`
		Other  string `sql:"other"`
		plain  int
	}
	if err := Load(&q, fsys, "cv_", "a.sql", "b.sql"); err != nil {
		t.Fatal(err)
	}
	if q.GetJob != "SELECT * FROM cv_jobs WHERE id = ?" || q.Count != "SELECT count(*) FROM cv_jobs" || q.Other != "SELECT 1" {
		t.Fatalf("loaded %+v", q)
	}

	var missing struct {
		GetJob string `sql:"get_job"`
		Typo   string `sql:"cuont"`
		Count  string `sql:"count"`
	}
	err := Load(&missing, fsys, "", "a.sql")
	if err == nil || !strings.Contains(err.Error(), `query "cuont" (field Typo) is in none of`) {
		t.Fatalf("a misspelled query name: %v", err)
	}

	var short struct {
		GetJob string `sql:"get_job"`
	}
	err = Load(&short, fsys, "", "a.sql")
	if err == nil || !strings.Contains(err.Error(), `query "count" of a.sql has no field`) {
		t.Fatalf("a query without a field: %v", err)
	}
	if err := Load(&short, fsys, "", "dup.sql"); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Fatalf("a query named twice: %v", err)
	}
	if err := Load(&q, fsys, "", "a.sql", "missing.sql"); err == nil || !strings.Contains(err.Error(), "missing.sql") {
		t.Fatalf("a missing file: %v", err)
	}
	var both struct {
		GetJob string `sql:"get_job"`
		Count  string `sql:"count"`
	}
	if err := Load(&both, fstest.MapFS{"a.sql": fsys["a.sql"], "c.sql": {Data: []byte("-- name: count\nSELECT 3\n")}}, "", "a.sql", "c.sql"); err == nil || !strings.Contains(err.Error(), "in both") {
		t.Fatalf("a query in two files: %v", err)
	}
	var twice struct {
		GetJob string `sql:"get_job"`
		Again  string `sql:"get_job"`
		Count  string `sql:"count"`
	}
	if err := Load(&twice, fsys, "", "a.sql"); err == nil || !strings.Contains(err.Error(), "two fields") {
		t.Fatalf("a query with two fields: %v", err)
	}
	if err := Load(q, fsys, "", "a.sql"); err == nil {
		t.Fatal("a struct value, not a pointer, was accepted")
	}
}

func TestRewrite(t *testing.T) {
	fsys := fstest.MapFS{"a.sql": {Data: []byte("-- name: cols\nid, name\n\n-- name: get\nSELECT {cols} FROM {p}t\n")}}
	var q struct {
		Cols  string `sql:"cols"`
		Get   string `sql:"get"`
		Other string
	}
	q.Other = "{cols}"
	if err := Load(&q, fsys, "x_", "a.sql"); err != nil {
		t.Fatal(err)
	}
	Rewrite(&q, strings.NewReplacer("{cols}", q.Cols).Replace)
	if q.Get != "SELECT id, name FROM x_t" || q.Cols != "id, name" || q.Other != "{cols}" {
		t.Fatalf("rewritten %+v", q)
	}
}
