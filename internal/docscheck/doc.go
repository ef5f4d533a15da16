// Package docscheck holds the repository's documentation checks, run by
// the normal go test ./...:
//
//   - every relative link in a Markdown file resolves in a clone: its
//     target is part of the repository, and its #anchor, if any, is a
//     heading (or an HTML anchor) of the Markdown file it points at;
//   - no file refers outside the repository: not to the design folder
//     beside a checkout, nor to an absolute path of the machine it was
//     written on (the patterns are in the test);
//   - every citation of "docs/contract.md section N" names a section
//     that exists in docs/contract.md.
//
// It has no API.
package docscheck
