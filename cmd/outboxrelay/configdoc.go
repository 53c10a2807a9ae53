package main

import (
	"fmt"
	"strings"

	"github.com/alecthomas/kong"
)

// The markers around the configuration table in docs/operations.md; the
// table between them is configTable's, checked by TestConfigTable.
const (
	configBegin = "<!-- config:begin -->"
	configEnd   = "<!-- config:end -->"
)

// configTable renders the run command's flags as the Markdown of
// docs/operations.md's configuration table: for each flag its name, its
// environment variable, its default and its help, read from the kong model
// of the command line, so the table says what `outboxrelay run --help`
// says. Hidden flags are left out. The flags of a group (the RabbitMQ TLS
// files, the column mapping) follow the others, a table per group under
// the group's title, in the order --help lists them.
func configTable() string {
	var cli CLI
	model := kong.Must(&cli, kong.Name("outboxrelay")).Model
	var run *kong.Node
	for _, n := range model.Children {
		if n.Name == "run" {
			run = n
		}
	}
	if run == nil {
		panic("configTable: the command line has no run command")
	}

	var ungrouped []*kong.Flag
	var groups []*kong.Group
	grouped := map[string][]*kong.Flag{}
	for _, f := range run.Flags {
		switch {
		case f.Hidden:
		case f.Group == nil:
			ungrouped = append(ungrouped, f)
		default:
			if _, ok := grouped[f.Group.Key]; !ok {
				groups = append(groups, f.Group)
			}
			grouped[f.Group.Key] = append(grouped[f.Group.Key], f)
		}
	}

	var b strings.Builder
	writeFlagTable(&b, ungrouped)
	for _, g := range groups {
		fmt.Fprintf(&b, "\n**%s**\n\n", g.Title)
		writeFlagTable(&b, grouped[g.Key])
	}
	return b.String()
}

func writeFlagTable(b *strings.Builder, flags []*kong.Flag) {
	b.WriteString("| flag | environment variable | default | meaning |\n")
	b.WriteString("| --- | --- | --- | --- |\n")
	for _, f := range flags {
		var envs []string
		for _, e := range f.Envs {
			envs = append(envs, code(e))
		}
		def := ""
		switch {
		case f.HasDefault:
			def = code(f.Default)
		case f.IsBool():
			def = code("false")
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", code(flagName(f)), strings.Join(envs, ", "), def, tableCell(f.Help))
	}
}

// flagName is the flag as --help shows it: --[no-]name for a negatable
// boolean.
func flagName(f *kong.Flag) string {
	name := f.Name
	if f.IsBool() && f.Tag.Negatable == "_" { // kong's mark of the default --no-name
		name = "[no-]" + name
	} else if f.IsBool() && f.Tag.Negatable != "" {
		name += "/--" + f.Tag.Negatable
	}
	if f.Short != 0 {
		return fmt.Sprintf("-%c, --%s", f.Short, name)
	}
	return "--" + name
}

// code is s as a Markdown code span.
func code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + s + "`"
}

// tableCell is s made safe for a Markdown table cell: one line, pipes escaped.
func tableCell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}
