package main

import (
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/version"
)

func init() { register(newVersionCmd) }

type versionView struct {
	Commit string `json:"commit"` // "" when the binary was built without one (go run, go test)
	Go     string `json:"go"`
	OS     string `json:"os"`
	Arch   string `json:"arch"`
	Kernel string `json:"kernel"` // the running kernel (uname -r)
}

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the commit this binary was built from, its Go version and the running kernel",
		Long: `Version prints the commit kedge was built from (set by 'make build'; a binary built
another way says "unknown"), the Go toolchain, and the kernel it runs on. Benchmark results
record the same commit in their envelope.`,
		Example: `  kedge version
  kedge version -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versionView{Commit: version.Revision(), Go: runtime.Version(), OS: runtime.GOOS,
				Arch: runtime.GOARCH, Kernel: bench.KernelRelease()}
			return writeReport(cmd.OutOrStdout(), output, v, func(w io.Writer) error {
				c := v.Commit
				if c == "" {
					c = "unknown (built without 'make build')"
				}
				_, err := fmt.Fprintf(w, "kedge %s\n%s %s/%s, kernel %s\n", c, v.Go, v.OS, v.Arch, v.Kernel)
				return err
			})
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}
