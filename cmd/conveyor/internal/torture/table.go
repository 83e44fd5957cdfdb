package torture

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// WriteTable prints one line per row (fault, backend, injected count
// columns, verdict) and then each row's details: what was injected,
// measurements and violations.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT\tBACKEND\tSECONDS\tENQUEUED\tCOMPLETED\tDISCARDED\tLOST\tCOMPLETED TWICE\tSTALE ACKS APPLIED\tSTALE ACKS REFUSED\tDUPLICATE EXECUTIONS\tOVERLAPS\tRECOVERY\tUNIQUE (DUP TOLD)\tSLOTS\tRESULT")
	for _, r := range rows {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\tn/a\n", r.Fault, r.Backend)
			continue
		}
		result := "ok"
		if !r.OK() {
			result = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d (%d)\t%s\t%s\n",
			r.Fault, r.Backend, r.Seconds, r.Enqueued, r.Completed, r.Discarded, r.Lost, r.CompletedTwice,
			r.StaleApplied, r.StaleRefused, dupText(r), overlapText(r), recoveryText(r), r.UniqueTold, r.DupTold, slotsText(r), result)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		fmt.Fprintf(w, "\n%s on %s:\n", r.Fault, r.Backend)
		if r.Skipped != "" {
			fmt.Fprintf(w, "  not applicable: %s\n", r.Skipped)
			continue
		}
		fmt.Fprintf(w, "  injected: %s\n", r.Injected)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
		for _, f := range r.Failures {
			fmt.Fprintf(w, "  FAIL: %s\n", f)
		}
	}
	return nil
}

func dupText(r Row) string {
	if r.Duplicates == 0 {
		return "0"
	}
	var causes []string
	for c, n := range r.DuplicateCauses {
		causes = append(causes, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(causes)
	explained := 0
	for _, n := range r.DuplicateCauses {
		explained += n
	}
	if u := r.Duplicates - explained; u > 0 {
		causes = append(causes, fmt.Sprintf("UNEXPLAINED %d", u))
	}
	return fmt.Sprintf("%d (%s)", r.Duplicates, strings.Join(causes, ", "))
}

func overlapText(r Row) string {
	if r.OverlapsExplained == 0 {
		return fmt.Sprint(r.Overlaps)
	}
	return fmt.Sprintf("%d (+%d past a dead lease)", r.Overlaps, r.OverlapsExplained)
}

func recoveryText(r Row) string {
	switch {
	case r.RecoveryS == nil:
		return "-"
	case *r.RecoveryS < 0:
		return "not recovered"
	default:
		return fmt.Sprintf("%.1fs", *r.RecoveryS)
	}
}

func slotsText(r Row) string {
	switch {
	case r.Slots < 0:
		return "-"
	case r.SlotsSkippedDown > 0:
		return fmt.Sprintf("%d (%d skipped while down)", r.Slots, r.SlotsSkippedDown)
	default:
		return fmt.Sprint(r.Slots)
	}
}
