package doccheck

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
)

// repoRoot is the repository, seen from this package's directory (where go test runs).
const repoRoot = "../.."

// documents are the files whose blocks and names are checked: README.md and docs/*.md.
func documents(t *testing.T) map[string][]byte {
	t.Helper()
	if bpftest.InGuest() {
		t.Skip("reads the repository's documents, which matrix guests do not have (runs on the host)")
	}
	paths, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, filepath.Join(repoRoot, "README.md"))
	docs := make(map[string][]byte, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, p)
		docs[rel] = b
	}
	if len(docs) < 2 {
		t.Fatalf("found %d documents under %s", len(docs), repoRoot)
	}
	return docs
}

func allBlocks(t *testing.T) []Block {
	t.Helper()
	var out []Block
	for doc, src := range documents(t) {
		bs, err := Blocks(doc, src)
		if err != nil {
			t.Error(err)
		}
		out = append(out, bs...)
	}
	return out
}

// TestWalkthroughMarks: every sh and console block says whether it runs (and a skipped one
// why), and no unlabelled block looks like a command.
func TestWalkthroughMarks(t *testing.T) {
	run, skip := 0, 0
	for _, b := range allBlocks(t) {
		if err := b.Check(); err != nil {
			t.Error(err)
		}
		if b.Mark != nil && b.Mark.Run {
			run++
		} else if b.Mark != nil {
			skip++
		}
	}
	t.Logf("%d walkthroughs run, %d skipped with a reason", run, skip)
	if run == 0 {
		t.Error("no document has a walkthrough marked to run")
	}
}

// sandbox is the shell that runs a block, as pid 1 of new PID, mount and network
// namespaces (unshare): /run and /tmp become private tmpfs mounts (kedge's run state, lab
// namespaces and files the block writes stay inside and vanish with it), the binary and
// the script are copied into /run/doctest before /tmp is covered, loopback comes up. The
// script runs under timeout(1); when it fails, the logs it left in /tmp are printed (a
// walkthrough sends a background program's stderr there). When the sandbox's shell ends
// - or the test, or unshare, dies - the kernel kills every process of the PID namespace,
// and the namespaces and mounts go with the last of them.
const sandbox = `set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 doctest-run /run
mkdir -p /run/doctest/bin
cp "$DOCTEST_KEDGE" /run/doctest/bin/kedge
cp "$DOCTEST_SCRIPT" /run/doctest/walkthrough.sh
mount -t tmpfs -o mode=1777 doctest-tmp /tmp
ip link set lo up
cd /tmp
export PATH=/run/doctest/bin:$PATH
limit=$DOCTEST_TIMEOUT
unset DOCTEST_KEDGE DOCTEST_SCRIPT DOCTEST_TIMEOUT
set +e
timeout --kill-after=2 "$limit" bash -e -o pipefail /run/doctest/walkthrough.sh
rc=$?
if [ $rc -eq 124 ]; then echo "doctest: the walkthrough did not end within $limit"; fi
if [ $rc -ne 0 ]; then
	for f in /tmp/*.log; do [ -f "$f" ] && { echo "--- $f (last lines)"; tail -n 20 "$f"; }; done
fi
exit $rc
`

// walkthrough is what runs in one sandbox: a marked block, or the blocks of a session.
type walkthrough struct {
	name    string // document:line of the first block
	blocks  []Block
	skip    string
	timeout time.Duration
}

func (w *walkthrough) script() string {
	var sb strings.Builder
	for _, b := range w.blocks {
		fmt.Fprintf(&sb, "# %s:%d\n%s", b.Doc, b.Line, b.Script())
	}
	return sb.String()
}

// walkthroughs groups the marked blocks: a block alone, or a session's blocks in document
// order under the name of its first.
func walkthroughs(blocks []Block) []*walkthrough {
	sort.SliceStable(blocks, func(i, j int) bool {
		if blocks[i].Doc != blocks[j].Doc {
			return blocks[i].Doc < blocks[j].Doc
		}
		return blocks[i].Line < blocks[j].Line
	})
	var out []*walkthrough
	sessions := map[string]*walkthrough{}
	for _, b := range blocks {
		if b.Mark == nil {
			continue
		}
		key := b.Doc + "\x00" + b.Mark.Session
		w := sessions[key]
		if w == nil || b.Mark.Session == "" {
			w = &walkthrough{name: fmt.Sprintf("%s:%d", b.Doc, b.Line)}
			out = append(out, w)
			if b.Mark.Session != "" {
				sessions[key] = w
			}
		}
		w.blocks = append(w.blocks, b)
		w.timeout = min(w.timeout+b.Mark.Timeout, MaxTimeout)
		if !b.Mark.Run && w.skip == "" {
			w.skip = b.Mark.Skip
		}
	}
	return out
}

// TestWalkthroughs runs every block marked run, each (or each session) in its own sandbox,
// with the binary built from this tree.
func TestWalkthroughs(t *testing.T) {
	blocks := allBlocks(t)
	if os.Geteuid() != 0 {
		t.Skip("walkthroughs need root (they make namespaces and load BPF programs)")
	}
	for _, tool := range []string{"unshare", "ip", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the walkthrough sandbox needs %s: %v", tool, err)
		}
	}
	var kedge string
	defer bpftest.RemoveKedgeBinary()
	for _, w := range walkthroughs(blocks) {
		t.Run(w.name, func(t *testing.T) {
			if w.skip != "" {
				t.Skipf("not run: %s", w.skip)
			}
			for _, b := range w.blocks {
				for _, n := range b.Mark.Needs {
					if _, err := exec.LookPath(n); err != nil {
						t.Skipf("needs %s, not installed here", n)
					}
				}
			}
			if kedge == "" {
				kedge = bpftest.KedgeBinary(t)
			}
			out, code, err := runScript(t, kedge, w.script(), w.timeout)
			if code == 3 {
				t.Skipf("this kernel lacks what the walkthrough needs (kedge exited 3):\n%s", tail(out, 2<<10))
			}
			if err != nil {
				t.Fatalf("%v\n--- script\n%s--- output\n%s", err, w.script(), tail(out, 16<<10))
			}
			for _, b := range w.blocks {
				for _, re := range b.Mark.Expect {
					if !re.Match(out) {
						t.Errorf("%s:%d: output does not match %q", b.Doc, b.Line, strings.TrimPrefix(re.String(), "(?m)"))
					}
				}
			}
			if t.Failed() {
				t.Logf("--- output\n%s", tail(out, 16<<10))
			}
		})
	}
}

// runScript runs a script in the sandbox and returns its output and exit code.
func runScript(t *testing.T, kedge, script string, timeout time.Duration) ([]byte, int, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "walkthrough.sh")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	// The sandbox's timeout(1) bounds the script; this one, later, the sandbox itself.
	ctx, cancel := context.WithTimeout(context.Background(), timeout+15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "bash", "-c", sandbox)
	cmd.Env = append(os.Environ(), "DOCTEST_KEDGE="+kedge, "DOCTEST_SCRIPT="+path, fmt.Sprintf("DOCTEST_TIMEOUT=%ds", int(timeout.Seconds())))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // the sandbox dies with the test
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("ran in %v", time.Since(start).Round(time.Millisecond))
	if ctx.Err() != nil {
		return out.Bytes(), -1, fmt.Errorf("the sandbox did not end within %v", timeout+15*time.Second)
	}
	if err != nil {
		return out.Bytes(), cmd.ProcessState.ExitCode(), fmt.Errorf("walkthrough failed: %w", err)
	}
	return out.Bytes(), 0, nil
}

func tail(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append([]byte("...\n"), b[len(b)-n:]...)
}
