package deploy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

// podman runs podman with the test's own containers.conf: runc (crun refuses this VM's
// cgroup v1 hybrid layout) and no default ulimits (root here lacks CAP_SYS_RESOURCE, so
// the runtime cannot set them). The host's containers.conf is never read or changed.
type podman struct {
	t   *testing.T
	env []string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	requireTool(t, "podman")
	requireTool(t, "runc")
	conf := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &podman{t: t, env: []string{"CONTAINERS_CONF=" + conf}}
}

func (p *podman) run(args ...string) string {
	p.t.Helper()
	return strings.TrimSpace(run(p.t, p.env, "podman", args...))
}

// dnsServer is dnsmasq answering kedge.test in a lab host.
type dnsServer struct {
	cmd  *exec.Cmd
	addr netip.AddrPort
}

func startDNS(t *testing.T, h *lab.Host) *dnsServer {
	t.Helper()
	dnsmasq := requireTool(t, "dnsmasq")
	addr := netip.AddrPortFrom(h.IPv4, 53)
	cmd := h.Command(dnsmasq, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--no-poll", "--bind-interfaces", "--listen-address="+h.IPv4.String(), "--port=53",
		"--address=/kedge.test/198.18.0.99", "--user=root", "--pid-file", "--cache-size=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := h.Start(cmd); err != nil {
		t.Fatalf("start dnsmasq: %v", err)
	}
	d := &dnsServer{cmd: cmd, addr: addr}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return d
}

// query sends n DNS queries for kedge.test to addr from host, one after the other, and
// returns how many were answered (the answer's id matching) within timeout each.
func query(t *testing.T, h *lab.Host, addr netip.AddrPort, firstID uint16, n int, timeout time.Duration) int {
	t.Helper()
	var conn *net.UDPConn
	if err := h.Do(func() (err error) {
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	answered := 0
	buf := make([]byte, 512)
	for i := range n {
		id := firstID + uint16(i)
		msg := binary.BigEndian.AppendUint16(nil, id)
		msg = append(msg, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD, one question
		msg = append(msg, 5, 'k', 'e', 'd', 'g', 'e', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1)
		if _, err := conn.Write(msg); err != nil {
			t.Fatalf("send query: %v", err)
		}
		deadline := time.Now().Add(timeout)
		for {
			_ = conn.SetReadDeadline(deadline)
			m, err := conn.Read(buf)
			if err != nil {
				break
			}
			if m >= 12 && binary.BigEndian.Uint16(buf) == id && buf[3]&0x0f == 0 && binary.BigEndian.Uint16(buf[6:]) > 0 {
				answered++
				break
			}
		}
	}
	return answered
}

// inNetns is an HTTP client whose connections are made inside host (the agent listens in
// the lab namespace its container shares).
func inNetns(h *lab.Host) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = h.Do(func() error {
				c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// metric returns the first sample of name whose line contains every fragment.
func metric(body, name string, fragments ...string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, f := range fragments {
			if !strings.Contains(line, f) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		return v, err == nil
	}
	return 0, false
}

// TestImageInLab builds the OCI image with scripts/image.sh, runs it with podman inside a
// lab namespace (--network ns:...) hedging DNS queries to two dnsmasq replicas, one of them
// stalled (SIGSTOP), and serving its metrics; then SIGKILLs the container and starts a new
// one, in another PID namespace, that removes what the first left (its delay line's
// namespace and veth, its owner record) and takes over; SIGTERM then detaches everything.
// Then the same with the Helm chart's mounts (/run/netns HostToContainer, read-only root):
// a killed agent leaves only its mount point, which the next one removes.
// The containers run with the capabilities docs/deploy.md lists for hedging, not
// --privileged.
func TestImageInLab(t *testing.T) {
	requireRoot(t)
	p := newPodman(t)
	root := repoRoot(t)
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tag := "localhost/kedge-test:" + hex.EncodeToString(rnd[:])
	out := t.TempDir()
	run(t, []string{"KEDGE_BIN=" + bpftest.KedgeBinary(t), "IMAGE_TAG=" + tag, "OUT_DIR=" + out, "COMMIT=test-" + hex.EncodeToString(rnd[:])},
		filepath.Join(root, "scripts/image.sh"))
	t.Cleanup(func() { _, _ = exec.Command("podman", "rmi", "--force", tag).CombinedOutput() })
	if got := p.run("inspect", "--format", "{{index .Labels \"org.opencontainers.image.revision\"}}", tag); got != "test-"+hex.EncodeToString(rnd[:]) {
		t.Errorf("image revision label %q", got)
	}
	for _, f := range []string{"kedge-image.oci.tar", "kedge-image.docker.tar"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() < 1<<20 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// The docker archive loads (what 'docker load' reads): podman load reports the same image.
	if got := p.run("load", "--input", filepath.Join(out, "kedge-image.docker.tar")); !strings.Contains(got, tag) {
		t.Errorf("podman load of the docker archive: %s", got)
	}
	// Nothing but the binary and the default config in it.
	if got := p.run("image", "history", "--format", "{{.CreatedBy}}", tag); strings.Contains(got, "FROM") && !strings.Contains(got, "scratch") {
		t.Errorf("image history shows a base image: %s", got)
	}

	l, err := lab.Up(lab.Spec{Name: "pod", Fabric: lab.Bridge, Hosts: []string{"client", "dns1", "dns2"}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	client := l.Host("client")
	dns1, dns2 := startDNS(t, l.Host("dns1")), startDNS(t, l.Host("dns2"))
	// dnsmasq takes a moment to bind.
	deadline := time.Now().Add(10 * time.Second)
	for query(t, client, dns1.addr, 1, 1, 200*time.Millisecond)+query(t, client, dns2.addr, 1, 1, 200*time.Millisecond) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("dnsmasq does not answer")
		}
	}

	dir := t.TempDir()
	runDir := filepath.Join(dir, "run-kedge")
	if err := os.Mkdir(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "kedge.yaml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`listen: 0.0.0.0:9464
log: {format: json}
retry: 500ms
hedge:
  - interface: eth0
    services:
      - name: dns
        address: %s
        replicas: [%s]
        request_id: {offset: 0, length: 2}
        delay: 5ms
        budget: {ratio: 1, burst: 1000}
`, dns1.addr, dns2.addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	metricsURL := "http://" + netip.AddrPortFrom(client.IPv4, 9464).String()
	hc := inNetns(client)
	get := func(path string) (int, string) {
		resp, err := hc.Get(metricsURL + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// start runs a container: as docs/deploy.md's podman example (/run/netns shared both
	// ways), or as the Helm chart's DaemonSet does (chart: /run/netns only from the host,
	// HostToContainer, and a read-only root file system).
	start := func(name string, chart bool) {
		t.Helper()
		netnsMount, more := "/run/netns:/run/netns:rshared", []string{}
		if chart {
			netnsMount, more = "/run/netns:/run/netns:rslave", []string{"--read-only"}
		}
		args := append([]string{"run", "-d", "--name", name, "--network", "ns:" + client.Path(),
			"--cap-drop", "all", "--cap-add", "BPF,PERFMON,NET_ADMIN,NET_RAW,SYS_ADMIN",
			"-v", netnsMount, "-v", runDir + ":/run/kedge", "-v", conf + ":/etc/kedge/kedge.yaml:ro"}, more...)
		p.run(append(args, tag)...)
		t.Cleanup(func() {
			rm := exec.Command("podman", "rm", "--force", "--time", "2", name)
			rm.Env = append(os.Environ(), p.env...)
			_, _ = rm.CombinedOutput()
		})
		deadline := time.Now().Add(60 * time.Second)
		for {
			code, body := get("/readyz")
			if code == http.StatusOK {
				return
			}
			if time.Now().After(deadline) {
				logs, _ := exec.Command("podman", "logs", name).CombinedOutput()
				t.Fatalf("container %s not ready within 60 s: %d %s\n%s", name, code, body, logs)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	hedged := func(label string, firstID uint16) float64 {
		t.Helper()
		if got := query(t, client, dns1.addr, firstID, 20, time.Second); got != 20 {
			t.Errorf("%s: %d of 20 queries answered with dns1 running", label, got)
		}
		if err := dns1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		got := query(t, client, dns1.addr, firstID+100, 100, time.Second)
		if err := dns1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if got != 100 {
			t.Errorf("%s: %d of 100 queries answered with dns1 stalled, want all (hedged to dns2)", label, got)
		}
		_, body := get("/metrics")
		won, ok := metric(body, "kedge_hedge_hedges_won_total", `service="dns"`, `interface="eth0"`)
		if !ok || won < 100 {
			t.Errorf("%s: kedge_hedge_hedges_won_total = %v (%v), want >= 100", label, won, ok)
		}
		return won
	}

	c1 := "kedge-test-agent1-" + hex.EncodeToString(rnd[:])
	start(c1, false)
	hedged("first container", 1000)

	// SIGKILL: the agent cannot clean up. What it made outside itself stays.
	p.run("kill", "--signal", "KILL", c1)
	p.run("wait", c1)
	owner1 := ownerOf(t, "kedge-dl1", client)
	if owner1 == "" {
		t.Fatal("after SIGKILL: no kedge-dl1 veth with an owner in the client namespace - nothing left to clean?")
	}
	dl1 := netnsx.Prefix + "-" + owner1 + "-hedge-dl1"
	if _, err := os.Stat(filepath.Join(netnsx.Dir, dl1)); err != nil {
		t.Fatalf("after SIGKILL: the delay line's namespace %s: %v", dl1, err)
	}
	if _, err := os.Stat(filepath.Join(runDir, "owners", owner1+".lock")); err != nil {
		t.Fatalf("after SIGKILL: owner record of %s: %v", owner1, err)
	}

	// A new container (a new PID namespace: its agent is pid 1 there too) cleans up and
	// takes over.
	c2 := "kedge-test-agent2-" + hex.EncodeToString(rnd[:])
	start(c2, false)
	if _, err := os.Stat(filepath.Join(netnsx.Dir, dl1)); err == nil {
		t.Errorf("the killed agent's namespace %s is still there", dl1)
	}
	if _, err := os.Stat(filepath.Join(runDir, "owners", owner1+".lock")); err == nil {
		t.Errorf("the killed agent's owner record is still there")
	}
	owner2 := ownerOf(t, "kedge-dl1", client)
	if owner2 == "" || owner2 == owner1 {
		t.Errorf("kedge-dl1 belongs to %q after the takeover (killed agent: %s)", owner2, owner1)
	}
	hedged("second container", 3000)

	// SIGTERM detaches everything and leaves nothing behind.
	p.run("stop", "--time", "20", c2)
	if code := p.run("inspect", "--format", "{{.State.ExitCode}}", c2); code != "0" {
		logs, _ := exec.Command("podman", "logs", c2).CombinedOutput()
		t.Errorf("agent exited %s on SIGTERM, want 0\n%s", code, logs)
	}
	if o := ownerOf(t, "kedge-dl1", client); o != "" {
		t.Errorf("kedge-dl1 (owner %s) still in the client namespace after SIGTERM", o)
	}
	entries, _ := os.ReadDir(netnsx.Dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), owner2) {
			t.Errorf("namespace %s left after SIGTERM", e.Name())
		}
	}
	if records, _ := filepath.Glob(filepath.Join(runDir, "owners", "*.lock")); len(records) > 0 {
		t.Errorf("owner records left after a clean exit: %v", records)
	}
	if got := query(t, client, dns1.addr, 5000, 10, time.Second); got != 10 {
		t.Errorf("after the agent's exit %d of 10 queries answered, want 10 (nothing attached any more)", got)
	}

	// As the chart runs it: the delay line's namespace is mounted in the container's own
	// mount namespace only, so a SIGKILL leaves just its empty mount point under the host's
	// /run/netns, which the next agent removes.
	c3, c4 := "kedge-test-agent3-"+hex.EncodeToString(rnd[:]), "kedge-test-agent4-"+hex.EncodeToString(rnd[:])
	start(c3, true)
	hedged("chart-like container", 6000)
	p.run("kill", "--signal", "KILL", c3)
	p.run("wait", c3)
	records, _ := filepath.Glob(filepath.Join(runDir, "owners", "*.lock"))
	if len(records) != 1 {
		t.Fatalf("owner records after SIGKILL: %v, want the killed agent's", records)
	}
	owner3 := strings.TrimSuffix(filepath.Base(records[0]), ".lock")
	dl3 := filepath.Join(netnsx.Dir, netnsx.Prefix+"-"+owner3+"-hedge-dl1")
	if _, err := os.Stat(dl3); err != nil {
		t.Errorf("after SIGKILL the mount point %s: %v", dl3, err)
	}
	start(c4, true)
	if _, err := os.Stat(dl3); err == nil {
		t.Errorf("the killed agent's mount point %s is still there", dl3)
	}
	hedged("chart-like container after the takeover", 8000)
	p.run("stop", "--time", "20", c4)
	if records, _ := filepath.Glob(filepath.Join(runDir, "owners", "*.lock")); len(records) > 0 {
		t.Errorf("owner records left after a clean exit: %v", records)
	}
}

var ownerAlias = regexp.MustCompile(`^kedge:([0-9]+_[0-9a-f]{6})$`)

// ownerOf returns the owner ID in the alias of link name in h ("" when there is none).
func ownerOf(t *testing.T, name string, h *lab.Host) string {
	t.Helper()
	nh, err := netlink.NewHandleAt(h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	l, err := nh.LinkByName(name)
	if err != nil {
		return ""
	}
	m := ownerAlias.FindStringSubmatch(l.Attrs().Alias)
	if m == nil {
		return ""
	}
	return m[1]
}
