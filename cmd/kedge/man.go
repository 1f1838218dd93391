package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/kedge-dev/kedge/internal/version"
)

func init() { register(newManCmd) }

// newManCmd writes the man pages of every command (kedge.1, kedge-agent.1, ...), made from
// the same text as --help; make deb installs them. Hidden: it is a build step, not a task.
func newManCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "gen-man DIR",
		Short:  "Write the man pages of every command into DIR",
		Hidden: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s needs the directory to write into (see '%s --help')", cmd.CommandPath(), cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return fmt.Errorf("create %s: %w", args[0], err)
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // reproducible pages: no date stamped in
			preformat(root)
			hdr := &doc.GenManHeader{Section: "1", Source: "kedge " + version.Revision(), Manual: "kedge manual"}
			if err := doc.GenManTree(root, hdr, args[0]); err != nil {
				return fmt.Errorf("write man pages: %w", err)
			}
			return nil
		},
	}
}

// preformat makes each command's long help a preformatted block in its man page: the help
// is laid out for a terminal (aligned columns, indented examples, snake_case names), which
// markdown would reflow and read as emphasis.
func preformat(c *cobra.Command) {
	if c.Long != "" {
		c.Long = "```\n" + c.Long + "\n```"
	}
	for _, sub := range c.Commands() {
		preformat(sub)
	}
}
