package main

import (
	"fmt"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// migrateCmd applies the schema migrations. It is the only command that
// creates a SQLite database.
func migrateCmd(e *env, args []string) error {
	f := e.flags("migrate", "migrate [--db DSN] [--prefix P] [--storage segments|table]", dbHelp)
	f.about = "Creates the database if it is a SQLite path that does not exist, then applies the\nembedded, numbered migrations (idempotent; a newer schema is refused).\nOn PostgreSQL, migration 10 converts a prefix on the one-table storage of earlier\nversions to the segments storage (docs/postgres-storage.md): one transaction moves\nevery job, running ones included; every process on the prefix follows it. One-way.\n--storage table makes migration 10 keep the one table; --storage segments converts\na prefix kept on the one table earlier."
	storage := f.String("storage", "", "PostgreSQL: the prefix's storage, segments (the default) or table (kept by migration 10)")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	if *storage != "" && *storage != "segments" && *storage != "table" {
		return usageError("migrate", fmt.Sprintf("--storage %q: the storages are segments and table", *storage))
	}
	o := e.connectOptions()
	o.PostgresStorage = *storage
	c, err := connect.OpenWith(e.ctx, e.queueDSN(), &conveyor.Config{TablePrefix: e.prefix.val}, o)
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
