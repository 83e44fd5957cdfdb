package driver

import (
	"testing"
	"time"
)

func TestQueueSkip(t *testing.T) {
	var s QueueSkip
	s.ForgetKeyless([]InsertParams{{Queue: "q"}}) // nothing to forget yet
	skip, mark := s.Look("q")
	if skip {
		t.Fatal("skipping before any SkipFor")
	}
	s.SkipFor("q", time.Minute, mark)
	if skip, _ := s.Look("q"); !skip {
		t.Fatal("not skipping after SkipFor")
	}
	// A job with a key, or of another queue, forgets nothing.
	s.ForgetKeyless([]InsertParams{{Queue: "q", Key: "a"}, {Queue: "r"}})
	if skip, _ := s.Look("q"); !skip {
		t.Fatal("forgotten by a job with a key or of another queue")
	}
	s.ForgetKeyless([]InsertParams{{Queue: "r"}, {Queue: "q", Key: "a"}, {Queue: "q"}})
	skip, mark = s.Look("q")
	if skip {
		t.Fatal("skipping after a job without a key was inserted")
	}
	// A claim that looked before the insert (mark) records no skip.
	s.Forget("q")
	s.SkipFor("q", time.Minute, mark)
	if skip, _ := s.Look("q"); skip {
		t.Fatal("skipping after SkipFor with a mark older than Forget")
	}
}
