package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestJobJSONMatchesAPI: jobs enqueued through the HTTP API with
// metadata, alone and in a batch, are printed by `conveyor job --json`
// and `conveyor jobs --json` byte for byte as the API answers them (GET
// of a job, a page of jobs; a claim adds only its fence), metadata
// included, and a job without metadata has "metadata": null in both. It
// fails if the command's and the API's shapes drift apart.
func TestJobJSONMatchesAPI(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			db := []string{"--db", dsn}
			if b.name != "sqlite" {
				db = append(db, "--prefix", freshPrefix(t, dsn))
			}
			mustCLI(t, append([]string{"migrate"}, db...)...)
			base := serve(t, append(db, "--insecure-loopback-dev", "--maintenance=false")...)
			call := func(method, path, body string, status int) []byte {
				t.Helper()
				got, out := request(t, method, base+path, "", body)
				if got != status {
					t.Fatalf("%s %s: %d, want %d: %s", method, path, got, status, out)
				}
				return []byte(strings.TrimSpace(out))
			}
			cmdJob := func(id int64) []byte {
				t.Helper()
				return []byte(strings.TrimSpace(mustCLI(t, append([]string{"job", "--json", fmt.Sprint(id)}, db...)...)))
			}

			meta := map[string]string{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "note": "<&> ✓"}
			mb, _ := json.Marshal(meta)
			var one struct{ ID int64 }
			if err := json.Unmarshal(call("POST", "/api/v1/jobs", `{"kind":"k","queue":"q","args":{"n":1},"timeout_ms":1500,"metadata":`+string(mb)+`}`, 201), &one); err != nil {
				t.Fatal(err)
			}
			var batch struct{ IDs []int64 }
			if err := json.Unmarshal(call("POST", "/api/v1/jobs/batch", `{"jobs":[`+
				`{"kind":"k","queue":"q","delay_ms":3600000,"metadata":{"request":"r-2"}},`+
				`{"kind":"k","queue":"q","delay_ms":3600000}]}`, 201), &batch); err != nil || len(batch.IDs) != 2 {
				t.Fatalf("batch: %v %v", err, batch.IDs)
			}
			ids := []int64{one.ID, batch.IDs[0], batch.IDs[1]}
			want := map[int64]map[string]string{one.ID: meta, batch.IDs[0]: {"request": "r-2"}}

			// The claim's job, without its fence, is what the command
			// prints of it at once (nothing renews the lease meanwhile).
			var claimed struct{ Jobs []map[string]json.RawMessage }
			if err := json.Unmarshal(call("POST", "/api/v1/claim", `{"queue":"q","worker":"w"}`, 200), &claimed); err != nil || len(claimed.Jobs) != 1 {
				t.Fatalf("claim: %v, %d jobs", err, len(claimed.Jobs))
			}
			c := claimed.Jobs[0]
			var fence int64
			if err := json.Unmarshal(c["fence"], &fence); err != nil || fence <= 0 {
				t.Fatalf("claimed job's fence: %s", c["fence"])
			}
			delete(c, "fence")
			var printed map[string]json.RawMessage
			if err := json.Unmarshal(cmdJob(one.ID), &printed); err != nil {
				t.Fatal(err)
			}
			if cj, pj := mustJSON(t, c), mustJSON(t, printed); cj != pj {
				t.Errorf("claimed job without its fence:\n%s\njob --json:\n%s", cj, pj)
			}
			// A failed attempt with a trace, so that errors are compared too.
			call("POST", fmt.Sprintf("/api/v1/jobs/%d/fail", one.ID), fmt.Sprintf(`{"fence":%d,"error":"boom","trace":"at line 3","retry_in_ms":3600000}`, fence), 200)

			for _, id := range ids {
				api, cmd := call("GET", fmt.Sprintf("/api/v1/jobs/%d", id), "", 200), cmdJob(id)
				if !bytes.Equal(api, cmd) {
					t.Errorf("job %d:\nAPI:          %s\njob --json:   %s", id, api, cmd)
				}
				var j struct {
					Metadata map[string]string
					Errors   []any
				}
				if err := json.Unmarshal(cmd, &j); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(j.Metadata, want[id]) {
					t.Errorf("job --json %d: metadata %v, want %v", id, j.Metadata, want[id])
				}
				if want[id] == nil && !bytes.Contains(cmd, []byte(`"metadata":null`)) {
					t.Errorf("job --json %d: %s, want \"metadata\":null", id, cmd)
				}
				if id == one.ID && len(j.Errors) != 1 {
					t.Errorf("job --json %d: errors %v, want the failed attempt", id, j.Errors)
				}
			}

			var page struct{ Jobs []json.RawMessage }
			if err := json.Unmarshal(call("GET", "/api/v1/jobs?queue=q", "", 200), &page); err != nil {
				t.Fatal(err)
			}
			var list []json.RawMessage
			if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"jobs", "--json", "--queue", "q"}, db...)...)), &list); err != nil {
				t.Fatal(err)
			}
			if len(page.Jobs) != len(ids) || len(list) != len(ids) {
				t.Fatalf("API listed %d jobs, jobs --json %d, want %d", len(page.Jobs), len(list), len(ids))
			}
			for i := range list {
				if !bytes.Equal(page.Jobs[i], list[i]) {
					t.Errorf("jobs[%d]:\nAPI:          %s\njobs --json:  %s", i, page.Jobs[i], list[i])
				}
			}
		})
	}
}

// mustJSON encodes v (a map: its keys sorted).
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
