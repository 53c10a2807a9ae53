// Package docs holds outboxrelay's documentation pages, by reader: producers,
// guarantees and ordering, operations, deployment, performance, reliability,
// architecture, and the decision records under decisions/. It has no Go code
// to import; its test checks that every relative link and anchor in the
// repository's Markdown resolves.
package docs
