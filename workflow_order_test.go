package conveyor

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// checkOrder fails unless order holds every job once, the jobs without
// dependencies first, and each job after all of its dependencies.
func checkOrder(t *testing.T, jobs []WorkflowJob, order []int) {
	t.Helper()
	if len(order) != len(jobs) {
		t.Fatalf("%d jobs ordered, want %d", len(order), len(jobs))
	}
	at := make(map[string]int, len(jobs))
	for k, i := range order {
		if _, dup := at[jobs[i].Name]; dup {
			t.Fatalf("job %q ordered twice", jobs[i].Name)
		}
		at[jobs[i].Name] = k
	}
	roots := true
	for k, i := range order {
		if len(jobs[i].DependsOn) > 0 {
			roots = false
		} else if !roots {
			t.Fatalf("job %q, without dependencies, is at %d after a job with some", jobs[i].Name, k)
		}
		for _, d := range jobs[i].DependsOn {
			if at[d] >= k {
				t.Fatalf("job %q at %d comes before its dependency %q at %d", jobs[i].Name, k, d, at[d])
			}
		}
	}
}

// TestWorkflowOrderLarge: a workflow of 100,000 jobs in a chain, listed
// last job first, and a job that depends on every one of them is ordered
// in time proportional to its jobs and dependencies (it used to take a
// pass over every job per job placed, and a scan of a job's dependencies
// per dependency: hours for this one).
func TestWorkflowOrderLarge(t *testing.T) {
	const n = 100_000
	jobs := make([]WorkflowJob, 0, n+1)
	all := make([]string, 0, n)
	for i := n - 1; i >= 0; i-- {
		j := WorkflowJob{Name: fmt.Sprint("step", i)}
		if i > 0 {
			j.DependsOn = []string{fmt.Sprint("step", i-1)}
		}
		jobs = append(jobs, j)
		all = append(all, j.Name)
	}
	jobs = append(jobs, WorkflowJob{Name: "last", DependsOn: all})
	order, err := workflowOrder(jobs)
	if err != nil {
		t.Fatal(err)
	}
	checkOrder(t, jobs, order)
}

// TestWorkflowOrderErrors: a bad workflow is refused with ErrInvalidOpts
// and an error naming what is wrong: a cycle names the jobs on it.
func TestWorkflowOrderErrors(t *testing.T) {
	for _, c := range []struct {
		jobs []WorkflowJob
		want []string
	}{
		{[]WorkflowJob{{Name: "a"}, {Name: "b", DependsOn: []string{"a", "d"}}, {Name: "c", DependsOn: []string{"b"}}, {Name: "d", DependsOn: []string{"c"}}},
			[]string{`cycle`, `"b" depends on "d"`, `"d" on "c"`, `"c" on "b"`}},
		{[]WorkflowJob{{Name: "a", DependsOn: []string{"b"}}, {Name: "b", DependsOn: []string{"a"}}},
			[]string{`cycle`, `"a" depends on "b"`, `"b" on "a"`}},
		{[]WorkflowJob{{Name: "a"}, {Name: "b", DependsOn: []string{"b"}}}, []string{`"b"`, `itself`}},
		{[]WorkflowJob{{Name: "a"}, {Name: "b", DependsOn: []string{"a", "a"}}}, []string{`"b"`, `"a"`, `twice`}},
		{[]WorkflowJob{{Name: "a"}, {Name: "b", DependsOn: []string{"z"}}}, []string{`"b"`, `"z"`, `not in the workflow`}},
		{[]WorkflowJob{{Name: "a"}, {Name: "a"}}, []string{`"a"`, `twice`}},
		{[]WorkflowJob{{Name: "a"}, {Name: ""}}, []string{`job 1`, `no name`}},
	} {
		_, err := workflowOrder(c.jobs)
		if !errors.Is(err, ErrInvalidOpts) {
			t.Errorf("%+v: %v, want ErrInvalidOpts", c.jobs, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %q does not say %s", c.jobs, err, w)
			}
		}
	}
}
