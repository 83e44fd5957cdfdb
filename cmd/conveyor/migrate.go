package main

import (
	"fmt"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// migrateCmd applies the schema migrations. It is the only command that
// creates a SQLite database.
func migrateCmd(e *env, args []string) error {
	f := e.flags("migrate", "migrate [--db DSN] [--prefix P] [--storage segments]", dbHelp)
	f.about = "Creates the database if it is a SQLite path that does not exist, then applies the\nembedded, numbered migrations (idempotent; a newer schema is refused).\n--storage segments (PostgreSQL) then converts the prefix to the segments storage\n(docs/postgres-storage.md): one transaction moves every job, running ones included;\nevery process on the prefix follows it. One-way."
	storage := f.String("storage", "", "PostgreSQL: convert the prefix to this storage (segments)")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	if *storage != "" && *storage != "segments" {
		return usageError("migrate", fmt.Sprintf("--storage %q: the only storage to convert to is segments", *storage))
	}
	c, err := connect.OpenWith(e.ctx, e.queueDSN(), &conveyor.Config{TablePrefix: e.prefix.val}, connect.Options{PostgresStorage: *storage})
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
