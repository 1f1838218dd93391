package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
)

func init() { register(newLabCmd) }

func newLabCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Build and use network-namespace labs (hosts joined by a bridge or router)",
		Long: `A lab is a set of hosts, one network namespace each with one interface eth0,
joined by a fabric namespace: a bridge (one L2 segment, 198.18.0.0/24 and
2001:db8::/64) or a router (host i on 198.18.i.0/24, 2001:db8:i::/64). Neighbours
are static and IPv6 DAD is off, so a lab is usable at once.

A lab made by 'kedge lab up' outlives the command (its namespaces are named
kedge-lab-<name>-<host>) until 'kedge lab down' or 'kedge cleanup --all'.
--prefix names them otherwise (give the same --prefix to down, exec, shell and
list; cleanup --all removes kedge-lab- labs only), --subnet and --subnet6 choose
the address plan. Nothing is created in the current network namespace.`,
		Example: `  sudo kedge lab up --name demo --hosts client,srv1,srv2 --fabric bridge
  sudo kedge lab exec demo client -- ip -br addr
  sudo kedge lab shell demo srv1
  sudo kedge lab list
  sudo kedge lab down demo`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown lab command %q: use up, down, exec, shell or list (see 'kedge lab --help')", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("kedge lab needs a command: up, down, exec, shell or list (see 'kedge lab --help')")
		},
	}
	cmd.PersistentFlags().StringVar(&labPrefix, "prefix", lab.PersistentPrefix, "start of the lab's namespace names")
	cmd.AddCommand(newLabUpCmd(), newLabDownCmd(), newLabExecCmd(), newLabShellCmd(), newLabListCmd())
	return cmd
}

// labPrefix is kedge lab's --prefix.
var labPrefix string

// checkLabPrefix validates --prefix (a usage error, exit 2).
func checkLabPrefix() error {
	if err := lab.ValidPrefix(labPrefix); err != nil {
		return usagef("--prefix: %v", err)
	}
	return nil
}

func newLabUpCmd() *cobra.Command {
	var (
		name, hosts, fabric, output string
		subnet4, subnet6            string
		mtu                         int
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create a persistent lab and print its hosts and addresses",
		Example: `  # three hosts on one bridge
  sudo kedge lab up --name demo --hosts client,srv1,srv2 --fabric bridge

  # routed, jumbo frames, addresses as JSON
  sudo kedge lab up --name wan --hosts a,b --fabric router --mtu 9000 -o json

  # another address plan and namespace names (down, exec, list take the same --prefix)
  sudo kedge lab --prefix t1- up --name x --hosts a,b --subnet 10.77.0.0/16 --subnet6 fd00:77::/48`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			if err := checkLabPrefix(); err != nil {
				return err
			}
			spec, err := labSpec(name, hosts, fabric, mtu)
			if err != nil {
				return err
			}
			if spec.Subnet4, spec.Subnet6, err = lab.ParseSubnets(subnet4, subnet6); err != nil {
				return usagef("%v", err)
			}
			if labPrefix != lab.PersistentPrefix {
				spec.NamePrefix = labPrefix
			}
			l, err := lab.Up(spec)
			if err != nil {
				return rootHint(fmt.Errorf("create lab %s: %w", name, err))
			}
			defer l.Release()
			if err := writeReport(cmd.OutOrStdout(), output, labJSON(l), func(w io.Writer) error { return writeLab(w, l) }); err != nil {
				return err
			}
			if output == outputText {
				first, pf := l.Hosts[0], ""
				if labPrefix != lab.PersistentPrefix {
					pf = " --prefix " + labPrefix
				}
				fmt.Fprintf(cmd.OutOrStdout(), "\nlab %s is up; try 'kedge lab%s exec %s %s -- ip addr', remove it with 'kedge lab%s down %s'\n",
					name, pf, name, first.HostName, pf, name)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "demo", "lab name: letters, digits and '_'")
	cmd.Flags().StringVar(&hosts, "hosts", "client,srv1,srv2", "comma-separated host names, in address order")
	cmd.Flags().StringVar(&fabric, "fabric", "bridge", "how hosts are joined: bridge or router")
	cmd.Flags().IntVar(&mtu, "mtu", 0, "interface MTU (0: the veth default, 1500)")
	cmd.Flags().StringVar(&subnet4, "subnet", lab.DefaultSubnet4.String(), "IPv4 /16 the addresses come from")
	cmd.Flags().StringVar(&subnet6, "subnet6", lab.DefaultSubnet6.String(), "IPv6 /48 the addresses come from")
	addOutputFlag(cmd, &output)
	return cmd
}

// labSpec validates the flags of lab up (usage errors, exit 2).
func labSpec(name, hosts, fabric string, mtu int) (lab.Spec, error) {
	f, err := lab.ParseFabric(fabric)
	if err != nil {
		return lab.Spec{}, usagef("--fabric: %v", err)
	}
	if err := lab.ValidName(name); err != nil {
		return lab.Spec{}, usagef("--name: %v", err)
	}
	if mtu != 0 && (mtu < 68 || mtu > 65535) {
		return lab.Spec{}, usagef("--mtu %d is out of range: use 68-65535, or 0 for the default", mtu)
	}
	var hs []string
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return lab.Spec{}, usagef("--hosts is empty: name at least one host, e.g. --hosts client,srv1")
	}
	spec := lab.Spec{Name: name, Fabric: f, Hosts: hs, MTU: mtu, Persistent: true}
	if err := spec.Validate(); err != nil {
		return lab.Spec{}, usagef("--hosts: %v", err)
	}
	return spec, nil
}

func newLabDownCmd() *cobra.Command {
	var quiet, kill bool
	cmd := &cobra.Command{
		Use:   "down NAME",
		Short: "Remove a persistent lab (and, with --kill, the processes still running in it)",
		Long: `Down removes a persistent lab's namespaces. Processes still running inside them (a
server started with 'kedge lab exec', a shell) would be orphaned in a namespace without
a name: Down names them and removes nothing, unless --kill stops them first (SIGTERM,
then SIGKILL after 2 s).`,
		Example: `  sudo kedge lab down demo
  sudo kedge lab down demo --kill   # also stop what still runs in it`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := lab.ValidName(args[0]); err != nil {
				return usagef("%v", err)
			}
			if err := checkLabPrefix(); err != nil {
				return err
			}
			if err := stopLabProcesses(cmd, args[0], kill, quiet); err != nil {
				return err
			}
			removed, err := lab.DownIn(labPrefix, args[0])
			if !quiet {
				for _, n := range removed {
					fmt.Fprintf(cmd.OutOrStdout(), "removed namespace %s\n", n)
				}
			}
			if errors.Is(err, lab.ErrNotFound) {
				return usagef("%w (see 'kedge lab list')", err)
			}
			return rootHint(err)
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print nothing unless something fails")
	cmd.Flags().BoolVar(&kill, "kill", false, "stop the processes still running in the lab's namespaces (SIGTERM, then SIGKILL)")
	return cmd
}

// labProc is a process running in one of a lab's namespaces.
type labProc struct {
	pid               int
	comm, ns, cmdline string
}

// labProcesses lists the processes (other than this one) whose network namespace is one of
// the lab's.
func labProcesses(l *lab.Lab) ([]labProc, error) {
	inodes := map[uint64]string{}
	nss := []*netnsx.Netns{l.Fabric}
	for _, h := range l.Hosts {
		nss = append(nss, h.Netns)
	}
	for _, n := range nss {
		var st unix.Stat_t
		if err := unix.Stat(n.Path(), &st); err == nil {
			inodes[st.Ino] = n.Name
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []labProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue // gone, or a kernel thread
		}
		ns, ok := inodes[st.Ino]
		if !ok {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, labProc{pid: pid, ns: ns, comm: strings.TrimSpace(string(comm)),
			cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))})
	}
	return out, nil
}

// stopLabProcesses names the processes running in lab name's namespaces; without kill that
// is an error (nothing is removed), with kill they are stopped: SIGTERM, SIGKILL after 2 s.
func stopLabProcesses(cmd *cobra.Command, name string, kill, quiet bool) error {
	l, err := lab.OpenIn(labPrefix, name)
	if err != nil {
		return nil // not there (DownIn says so), or broken: nothing to look into
	}
	defer l.Release()
	procs, err := labProcesses(l)
	if err != nil || len(procs) == 0 {
		return err
	}
	var lines []string
	for _, p := range procs {
		lines = append(lines, fmt.Sprintf("  pid %d in %s: %s", p.pid, p.ns, p.cmdline))
	}
	if !kill {
		return fmt.Errorf("%d process(es) still run in lab %s; stop them, or add --kill to stop them with the lab:\n%s",
			len(procs), name, strings.Join(lines, "\n"))
	}
	for _, p := range procs {
		if err := unix.Kill(p.pid, unix.SIGTERM); err == nil && !quiet {
			fmt.Fprintf(cmd.OutOrStdout(), "stopping pid %d (%s) in %s\n", p.pid, p.comm, p.ns)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if left, _ := labProcesses(l); len(left) == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // polling for exits: no event to wait on for non-children
	}
	left, _ := labProcesses(l)
	for _, p := range left {
		if err := unix.Kill(p.pid, unix.SIGKILL); err == nil && !quiet {
			fmt.Fprintf(cmd.OutOrStdout(), "killed pid %d (%s) in %s\n", p.pid, p.comm, p.ns)
		}
	}
	return nil
}

func newLabExecCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec NAME HOST -- COMMAND [ARGS...]",
		Short: "Run a command inside a lab host",
		Long: `Exec runs a command in the network namespace of a lab host, with this terminal's
stdin, stdout and stderr. The command is forked from a thread inside the namespace
(not via 'ip netns exec'), so /sys, and with it /sys/fs/bpf, stays as it is.
kedge exits with the command's exit status. SIGTERM, SIGHUP and SIGQUIT sent to kedge
are passed on to the command (SIGINT reaches it from the terminal).`,
		Example: `  sudo kedge lab exec demo client -- ip -br addr
  sudo kedge lab exec demo srv1 -- /bin/sh -c 'cat /proc/net/dev'`,
		Args: func(cmd *cobra.Command, args []string) error {
			args = stripDash(args)
			if len(args) < 3 {
				return usagef("kedge lab exec needs a lab, a host and a command, e.g. 'kedge lab exec demo client -- ip addr'")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			args = stripDash(args)
			h, release, err := openHost(args[0], args[1])
			if err != nil {
				return err
			}
			defer release()
			c := h.Command(args[2], args[3:]...)
			return runAttached(cmd, h, c)
		},
	}
	cmd.Flags().SetInterspersed(false) // everything after NAME belongs to the command
	return cmd
}

func newLabShellCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "shell NAME HOST",
		Short: "Start an interactive shell inside a lab host",
		Long: `Shell starts $SHELL (or /bin/sh) in the network namespace of a lab host, with
KEDGE_LAB and KEDGE_HOST set and a prompt naming the host. Leave it with 'exit'.`,
		Example: `  sudo kedge lab shell demo srv1`,
		Args:    exactArgs("NAME", "HOST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, release, err := openHost(args[0], args[1])
			if err != nil {
				return err
			}
			defer release()
			sh := os.Getenv("SHELL")
			if sh == "" {
				sh = "/bin/sh"
			}
			c := h.Command(sh)
			c.Env = append(os.Environ(), "KEDGE_LAB="+args[0], "KEDGE_HOST="+args[1],
				fmt.Sprintf("PS1=[kedge %s/%s] # ", args[0], args[1]))
			fmt.Fprintf(cmd.ErrOrStderr(), "shell in host %s of lab %s (%s); 'exit' leaves it\n", args[1], args[0], h.IPv4)
			return runAttached(cmd, h, c)
		},
	}
}

func newLabListCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List persistent labs with their hosts and addresses",
		Example: `  sudo kedge lab list
  sudo kedge lab list -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			if err := checkLabPrefix(); err != nil {
				return err
			}
			names, err := lab.ListPersistentIn(labPrefix)
			if err != nil {
				return err
			}
			var labs []labView
			for _, n := range names {
				l, err := lab.OpenIn(labPrefix, n)
				if err != nil {
					labs = append(labs, labView{Name: n, Error: err.Error()})
					continue
				}
				labs = append(labs, labJSON(l))
				l.Release()
			}
			return writeReport(cmd.OutOrStdout(), output, labsOrEmpty(labs), func(w io.Writer) error { return writeLabList(w, labs) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func labsOrEmpty(l []labView) []labView {
	if l == nil {
		return []labView{}
	}
	return l
}

// stripDash drops the "--" between HOST and COMMAND (kept as an argument because flag
// parsing stops at NAME).
func stripDash(args []string) []string {
	if len(args) > 2 && args[2] == "--" {
		return append(args[:2:2], args[3:]...)
	}
	return args
}

// exactArgs requires the named positional arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usagef("%s needs %s, got %d argument(s) (see '%s --help')",
				cmd.CommandPath(), strings.Join(names, " "), len(args), cmd.CommandPath())
		}
		return nil
	}
}

// openHost opens a persistent lab and returns one host; release lets go of the lab.
func openHost(labName, host string) (*lab.Host, func(), error) {
	if err := lab.ValidName(labName); err != nil {
		return nil, nil, usagef("%v", err)
	}
	if err := checkLabPrefix(); err != nil {
		return nil, nil, err
	}
	l, err := lab.OpenIn(labPrefix, labName)
	if errors.Is(err, lab.ErrNotFound) {
		return nil, nil, usageError{Err: err} // a name that does not exist, as with interfaces
	}
	if err != nil {
		return nil, nil, rootHint(err)
	}
	h := l.Host(host)
	if h == nil {
		l.Release()
		return nil, nil, usagef("lab %s has no host %q: its hosts are %s", labName, host, strings.Join(l.Spec.Hosts, ", "))
	}
	return h, l.Release, nil
}

// runAttached runs c in h with the command's stdio and returns its exit status as the
// error's exit code. kedge ignores SIGINT meanwhile: the child (same process group) gets it
// from the terminal. SIGTERM, SIGHUP and SIGQUIT sent to kedge are passed on to the child,
// so a supervisor that stops kedge stops the command too instead of orphaning it.
func runAttached(cmd *cobra.Command, h *lab.Host, c *exec.Cmd) error {
	c.Stdin, c.Stdout, c.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT) // caught (not ignored), so the child keeps the defaults
	defer signal.Stop(sig)
	if err := h.Start(c); err != nil {
		return fmt.Errorf("start %s in %s: %w", c.Path, h.HostName, err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case s := <-sig:
				if s != os.Interrupt {
					_ = c.Process.Signal(s)
				}
			case <-done:
				return
			}
		}
	}()
	err := c.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if code < 0 {
			code = exitError // killed by a signal
		}
		return exitCodeError{code, fmt.Errorf("%s in %s: %w", c.Path, h.HostName, err)}
	}
	if err != nil {
		return fmt.Errorf("wait for %s in %s: %w", c.Path, h.HostName, err)
	}
	return nil
}

// labView is the JSON (and table) form of a lab.
type labView struct {
	Name   string     `json:"name"`
	Fabric string     `json:"fabric,omitempty"`
	MTU    int        `json:"mtu,omitempty"`
	Hosts  []hostView `json:"hosts,omitempty"`
	Error  string     `json:"error,omitempty"` // a lab that could not be opened
}

type hostView struct {
	Host      string `json:"host"`
	Namespace string `json:"namespace"`
	Iface     string `json:"iface"`
	IfIndex   int    `json:"ifindex"`
	MAC       string `json:"mac"`
	IPv4      string `json:"ipv4"`
	IPv6      string `json:"ipv6"`
	Gateway4  string `json:"gateway4,omitempty"`
	Gateway6  string `json:"gateway6,omitempty"`
}

func labJSON(l *lab.Lab) labView {
	v := labView{Name: l.Spec.Name, Fabric: l.Spec.Fabric.String(), MTU: l.Spec.MTU}
	for _, h := range l.Hosts {
		hv := hostView{Host: h.HostName, Namespace: h.Name, Iface: h.Iface, IfIndex: h.IfIndex,
			MAC: h.MAC.String(), IPv4: h.IPv4.String(), IPv6: h.IPv6.String()}
		if h.Gateway4.IsValid() {
			hv.Gateway4, hv.Gateway6 = h.Gateway4.String(), h.Gateway6.String()
		}
		v.Hosts = append(v.Hosts, hv)
	}
	return v
}

func writeLab(w io.Writer, l *lab.Lab) error {
	v := labJSON(l)
	fmt.Fprintf(w, "lab %s (%s fabric)\n", v.Name, v.Fabric)
	return writeHosts(w, v.Hosts, "  ")
}

func writeHosts(w io.Writer, hosts []hostView, indent string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%sHOST\tIPV4\tIPV6\tMAC\tGATEWAY\tNAMESPACE\n", indent)
	for _, h := range hosts {
		gw := h.Gateway4
		if gw == "" {
			gw = "-"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\n", indent, h.Host, h.IPv4, h.IPv6, h.MAC, gw, h.Namespace)
	}
	return tw.Flush()
}

func writeLabList(w io.Writer, labs []labView) error {
	if len(labs) == 0 {
		_, err := fmt.Fprintln(w, "no labs; create one with 'kedge lab up'")
		return err
	}
	for i, v := range labs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if v.Error != "" {
			fmt.Fprintf(w, "lab %s: broken: %s\n", v.Name, v.Error)
			continue
		}
		fmt.Fprintf(w, "lab %s (%s fabric)\n", v.Name, v.Fabric)
		if err := writeHosts(w, v.Hosts, "  "); err != nil {
			return err
		}
	}
	return nil
}
