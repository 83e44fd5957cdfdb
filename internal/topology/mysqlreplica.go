package topology

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// MariaDBNode is a private MariaDB server on a loopback port, run as the
// mysql system user from a data directory of its own, with its binary log
// on and a server_id of its own, so that it can be a replication primary
// or replica (the tests set replication up with SQL). Stop (or Kill) it on
// every exit path.
type MariaDBNode struct {
	// Name is what the node is in messages.
	Name string
	// Port is its loopback port.
	Port int
	// ServerID is its server_id.
	ServerID int
	// Proc is the server process.
	Proc *Proc
}

// MariaDBTools are the executables StartMariaDB needs (Debian package
// mariadb-server).
var MariaDBTools = []string{"/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db"}

// DSN returns a conveyor DSN for database db on the node as root.
func (n *MariaDBNode) DSN(db string) string {
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/%s", n.Port, db)
}

// SQLDSN returns a go-sql-driver/mysql DSN for database db on the node
// as root.
func (n *MariaDBNode) SQLDSN(db string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s?timeout=5s&readTimeout=30s&writeTimeout=30s", n.Port, db)
}

// Stop ends the server (SIGTERM, then SIGKILL) and waits for it.
func (n *MariaDBNode) Stop() {
	if n.Proc != nil {
		n.Proc.Stop(5 * time.Second)
	}
}

// Kill kills the server at once (kill -9), as a crash of its machine
// would: what it had not sent to its replicas is lost to them.
func (n *MariaDBNode) Kill() {
	if n.Proc != nil {
		n.Proc.Kill()
	}
}

// StartMariaDB makes a fresh data directory under dir (owned by the mysql
// user; see TempDir) and starts a server on a free port with the binary
// log on (GTIDs, row format) and the given server_id, env added to its
// environment. It waits until the server accepts connections, bounded by
// ctx and a minute.
func StartMariaDB(ctx context.Context, name, dir string, serverID int, env []string) (*MariaDBNode, error) {
	data := filepath.Join(dir, "data")
	// --tmpdir: bootstraps running at once in the shared /tmp collide on
	// their temporary tables' names.
	if err := runAsOwner(ctx, "mysql", dir, nil, MariaDBTools[1], "--no-defaults", "--datadir="+data, "--tmpdir="+dir,
		"--auth-root-authentication-method=normal", "--skip-test-db"); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(MariaDBTools[0], "--no-defaults", "--datadir="+data, "--tmpdir="+dir, "--port="+strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "pid"),
		"--log-bin="+filepath.Join(dir, "binlog"), "--binlog-format=ROW", "--server-id="+strconv.Itoa(serverID),
		"--innodb-buffer-pool-size=32M", "--skip-name-resolve", "--max-connections=100")
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}, env...)
	p, err := Start(name, "mysql", filepath.Join(dir, "server.log"), cmd)
	if err != nil {
		return nil, err
	}
	n := &MariaDBNode{Name: name, Port: port, ServerID: serverID, Proc: p}
	if err := WaitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", port), time.Minute); err != nil {
		err = fmt.Errorf("%w\n%s", err, p.Tail(10))
		n.Stop()
		return nil, err
	}
	return n, nil
}
