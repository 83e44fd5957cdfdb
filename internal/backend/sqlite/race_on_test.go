//go:build race

package sqlite

// raceEnabled is true when the race detector is on (it slows SQLite, which
// is pure Go here, by an order of magnitude).
const raceEnabled = true
