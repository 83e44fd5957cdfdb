package driver

import (
	"testing"
	"time"
)

func TestQueueSkip(t *testing.T) {
	s := QueueSkip{For: time.Minute}
	s.ForgetKeyless([]InsertParams{{Queue: "q"}}) // nothing to forget yet
	look, mark := s.Look("q")
	if !look {
		t.Fatal("skipping before any Skip")
	}
	s.Skip("q", mark)
	if look, _ := s.Look("q"); look {
		t.Fatal("not skipping after Skip")
	}
	// A job with a key, or of another queue, forgets nothing.
	s.ForgetKeyless([]InsertParams{{Queue: "q", Key: "a"}, {Queue: "r"}})
	if look, _ := s.Look("q"); look {
		t.Fatal("forgotten by a job with a key or of another queue")
	}
	s.ForgetKeyless([]InsertParams{{Queue: "r"}, {Queue: "q", Key: "a"}, {Queue: "q"}})
	look, mark = s.Look("q")
	if !look {
		t.Fatal("skipping after a job without a key was inserted")
	}
	// A claim that looked before the insert (mark) records no skip.
	s.Forget("q")
	s.Skip("q", mark)
	if look, _ := s.Look("q"); !look {
		t.Fatal("skipping after Skip with a mark older than Forget")
	}
}

func TestQueueSkipFor(t *testing.T) {
	// The zero value skips for DefaultSkip; For sets another period.
	var def QueueSkip
	_, mark := def.Look("q")
	def.Skip("q", mark)
	if look, _ := def.Look("q"); look {
		t.Fatal("the zero value did not skip after Skip")
	}
	short := QueueSkip{For: time.Millisecond}
	_, mark = short.Look("q")
	short.Skip("q", mark)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if look, _ := short.Look("q"); look {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a skip of 1 ms still held after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}
