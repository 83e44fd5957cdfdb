package main

import (
	"fmt"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// migrateCmd applies the schema migrations. It is the only command that
// creates a SQLite database.
func migrateCmd(e *env, args []string) error {
	f := e.flags("migrate", "migrate [--db DSN] [--prefix P]", dbHelp)
	f.about = "Creates the database if it is a SQLite path that does not exist, then applies the\nembedded, numbered migrations (idempotent; a newer schema is refused).\nOn PostgreSQL it then converts a prefix whose jobs an earlier version kept in one\ntable to the segment tables (docs/postgres-storage.md): one transaction moves every\njob, running ones included. One-way."
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	c, err := connect.OpenWith(e.ctx, e.queueDSN(), &conveyor.Config{TablePrefix: e.prefix.val}, e.connectOptions())
	if err != nil {
		return err
	}
	defer c.Close()
	applied, err := c.Migrate(e.ctx)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(e.stdout, "schema is up to date")
		return nil
	}
	fmt.Fprintf(e.stdout, "applied migrations %v\n", applied)
	return nil
}
