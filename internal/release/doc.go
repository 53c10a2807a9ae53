// Package release holds the checks of what a release publishes: its
// tests build a file-based module proxy from the working tree at the
// versions the modules require of each other, and resolve, build and
// install the modules from it as an application would.
package release
