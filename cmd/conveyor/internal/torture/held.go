package torture

import (
	"context"
	"time"
)

// checkHeldSnapshot proves, at the end of a MySQL phase run with
// Options.HoldXmin (after the drain, before the transaction is released),
// that the consistent snapshot taken before the workers started was held
// through the whole phase: counted again in the held transaction, the
// tables it read at its start still hold as many rows as then, though a
// fresh read finds more, and information_schema.innodb_trx shows its
// connection's transaction begun no later than the hold. A snapshot that
// ended (its connection lost, a rollback, a new transaction on it) fails
// the phase, but in the fault that restarts the server, whose restart
// ends it.
func (p *phase) checkHeldSnapshot(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	f := p.hold.Figures()
	heldFor := time.Since(p.heldAt)
	end, err := p.hold.Recount(ctx)
	if err != nil {
		if p.f.restarts {
			p.note("held snapshot: ended by the server's restart (%s)", firstLine(err.Error()))
			return
		}
		p.fail("held snapshot: counting its tables again in the held transaction: %v", err)
		return
	}
	now, err := p.adm.myRows(ctx, f.Tables)
	if err != nil {
		p.fail("held snapshot: counting its tables: %v", err)
		return
	}
	age, open, err := p.adm.myTrxAge(ctx, f.Thread)
	if err != nil {
		p.fail("held snapshot: reading information_schema.innodb_trx: %v", err)
		return
	}
	p.note("held snapshot: %d rows at its start, %d at the end in the held transaction, %d in the tables now; open in information_schema.innodb_trx %t (connection %d), begun %ds ago, held %.1fs",
		f.Rows, end, now, open, f.Thread, age, heldFor.Seconds())
	switch {
	case end != f.Rows:
		p.fail("held snapshot: the held transaction counted %d rows at the end, %d at its start: its snapshot did not last the phase", end, f.Rows)
	case now <= f.Rows:
		p.fail("held snapshot: the tables it read hold %d rows, %d at its start: nothing written past the snapshot, the check proved nothing", now, f.Rows)
	case !open:
		p.fail("held snapshot: connection %d has no transaction in information_schema.innodb_trx", f.Thread)
	// innodb_trx's trx_started is to the second: one second of slack.
	case age < int64(heldFor.Seconds())-1:
		p.fail("held snapshot: the transaction of connection %d began %ds ago, the hold %.1fs ago: not the transaction held from the start", f.Thread, age, heldFor.Seconds())
	}
}
