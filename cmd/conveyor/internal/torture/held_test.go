package torture

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// checkHeldSnapshot passes a snapshot held through the phase, and fails
// one whose transaction ended (here its connection killed, as a server
// or a proxy could) and one the phase wrote nothing past; in the restart
// fault a snapshot ended by the restart is only noted.
func TestCheckHeldSnapshot(t *testing.T) {
	dsn := testdb.MySQL(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		restarts bool
		write    bool
		kill     bool
		want     string // the failure, "" for none
	}{
		{name: "held", write: true},
		{name: "ended", write: true, kill: true, want: "held snapshot: counting its tables again in the held transaction"},
		{name: "nothing written", want: "nothing written past the snapshot"},
		{name: "ended by the restart", restarts: true, write: true, kill: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &phase{o: &Options{Log: io.Discard}, f: &fault{name: "test", restarts: tc.restarts}, backend: "mysql", dsn: dsn, prefix: newPrefix()}
			adm, err := openAdmin(ctx, dsn, p.prefix)
			if err != nil {
				t.Fatal(err)
			}
			defer adm.close()
			p.adm = adm
			table := "`" + p.prefix + "t`"
			if _, err := adm.db.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			defer adm.db.ExecContext(ctx, "DROP TABLE "+table)
			if _, err := adm.db.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1), (2)"); err != nil {
				t.Fatal(err)
			}
			p.hold, err = bench.HoldSnapshot(ctx, dsn, "mysql", p.prefix, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer p.hold.Release()
			p.heldAt = time.Now()
			if tc.write {
				if _, err := adm.db.ExecContext(ctx, "INSERT INTO "+table+" VALUES (3)"); err != nil {
					t.Fatal(err)
				}
			}
			if tc.kill {
				if _, err := adm.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", p.hold.Figures().Thread)); err != nil {
					t.Fatal(err)
				}
			}
			p.checkHeldSnapshot(ctx)
			switch {
			case tc.want == "" && len(p.failures) > 0:
				t.Errorf("failures %q (notes %q)", p.failures, p.notes)
			case tc.want != "" && (len(p.failures) != 1 || !strings.Contains(p.failures[0], tc.want)):
				t.Errorf("failures %q, want one with %q (notes %q)", p.failures, tc.want, p.notes)
			}
			if tc.name == "held" && (len(p.notes) != 1 || !strings.HasPrefix(p.notes[0], "held snapshot: 2 rows at its start, 2 at the end in the held transaction, 3 in the tables now; open in information_schema.innodb_trx true")) {
				t.Errorf("notes %q", p.notes)
			}
			if tc.restarts && (len(p.notes) != 1 || !strings.HasPrefix(p.notes[0], "held snapshot: ended by the server's restart")) {
				t.Errorf("notes %q", p.notes)
			}
		})
	}
}
