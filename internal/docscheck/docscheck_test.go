package docscheck

import (
	"bytes"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// repo is the module root and the files a clone of it holds, by
// slash-separated path relative to the root.
type repo struct {
	root  string
	files map[string]bool
	dirs  map[string]bool
}

// loadRepo finds the module root above the test's directory and lists the
// repository's files: git's tracked files plus new ones it does not ignore,
// so a link to a file that is ignored (local state, build output) fails
// although it exists here. Without git (an exported tree) it walks the
// tree, skipping .git and the directories .gitignore names for local state.
func loadRepo(t *testing.T) *repo {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	r := &repo{root: dir, files: map[string]bool{}, dirs: map[string]bool{"": true}}
	var names []string
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err == nil {
		names = strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	} else {
		skip := map[string]bool{".git": true, ".durallm": true, ".data": true, "bin": true, "durallm-results": true}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if skip[d.Name()] {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil // a worktree's .git file
			}
			if d.Type().IsRegular() {
				rel, _ := filepath.Rel(dir, p)
				names = append(names, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		if n == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(n))); err != nil {
			continue // deleted in the working tree
		}
		r.files[n] = true
		for d := path.Dir(n); d != "." && !r.dirs[d]; d = path.Dir(d) {
			r.dirs[d] = true
		}
	}
	if len(r.files) == 0 {
		t.Fatal("no files found in the repository")
	}
	return r
}

func (r *repo) read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.root, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r *repo) markdown() []string {
	var md []string
	for n := range r.files {
		if strings.EqualFold(path.Ext(n), ".md") {
			md = append(md, n)
		}
	}
	slices.Sort(md)
	return md
}

var (
	fence      = regexp.MustCompile("^\\s{0,3}(```|~~~)")
	codeSpan   = regexp.MustCompile("``[^`]*``|`[^`]*`")
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+"[^"]*"|\s+'[^']*')?\s*\)`)
	refDef     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	scheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	atxHeading = regexp.MustCompile(`^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:[^>]*\s)?(?:id|name)="([^"]+)"`)
)

// proseLines returns a Markdown file's lines with fenced code blocks
// blanked and inline code spans removed, keeping line numbers.
func proseLines(b []byte) []string {
	lines := strings.Split(string(b), "\n")
	inFence := ""
	for i, l := range lines {
		if m := fence.FindStringSubmatch(l); m != nil {
			switch {
			case inFence == "":
				inFence = m[1]
			case inFence == m[1]:
				inFence = ""
			}
			lines[i] = ""
			continue
		}
		if inFence != "" {
			lines[i] = ""
			continue
		}
		lines[i] = codeSpan.ReplaceAllString(l, "")
	}
	return lines
}

// link is one relative link found in a Markdown file.
type link struct {
	line   int
	target string
}

func links(b []byte) []link {
	var ls []link
	for i, l := range proseLines(b) {
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			ls = append(ls, link{i + 1, strings.Trim(m[1], "<>")})
		}
		if m := refDef.FindStringSubmatch(l); m != nil {
			ls = append(ls, link{i + 1, strings.Trim(m[1], "<>")})
		}
	}
	return ls
}

// anchors returns the fragment ids GitHub gives a Markdown file's
// headings (and any HTML anchors in it).
func anchors(b []byte) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	add := func(text string) {
		id := slug(text)
		if n := seen[id]; n > 0 {
			seen[id]++
			id = fmt.Sprintf("%s-%d", id, n)
		} else {
			seen[id] = 1
		}
		ids[id] = true
	}
	raw := strings.Split(string(b), "\n")
	prose := proseLines(b)
	for i, l := range prose {
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			add(headingText(raw[i]))
		} else if i+1 < len(prose) && strings.TrimSpace(l) != "" && !strings.Contains(l, "|") &&
			(isUnderline(prose[i+1], '=') || isUnderline(prose[i+1], '-')) {
			add(raw[i])
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			ids[m[1]] = true
		}
	}
	return ids
}

func isUnderline(l string, c rune) bool {
	l = strings.TrimSpace(l)
	return l != "" && strings.Trim(l, string(c)) == ""
}

// headingText is an ATX heading's text with its code spans kept (GitHub
// slugs their content) and its markers removed.
func headingText(l string) string {
	m := atxHeading.FindStringSubmatch(l)
	if m == nil {
		return l
	}
	return m[1]
}

var mdLinkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// slug is GitHub's heading id: the text as rendered, lower-cased, every
// character but letters, digits, spaces, hyphens and underscores dropped,
// spaces made hyphens.
func slug(text string) string {
	text = mdLinkText.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestMarkdownLinksResolve fails naming every relative link, in every
// Markdown file of the repository, whose target a clone would not have:
// a missing file, one outside the repository or not part of it, an
// absolute path, or an #anchor that is not a heading of the Markdown file
// it points at. Web and mail links, and links to an anchor of the same
// file, are not checked.
func TestMarkdownLinksResolve(t *testing.T) {
	r := loadRepo(t)
	md := r.markdown()
	if len(md) == 0 {
		t.Fatal("no Markdown files found")
	}
	anchorCache := map[string]map[string]bool{}
	checked := 0
	for _, name := range md {
		for _, l := range links(r.read(t, name)) {
			target := l.target
			if target == "" || strings.HasPrefix(target, "#") {
				continue
			}
			if scheme.MatchString(target) {
				s := strings.ToLower(target)
				if strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") || strings.HasPrefix(s, "mailto:") {
					continue
				}
				t.Errorf("%s:%d: link %q: only http(s) and mailto links may leave the repository", name, l.line, target)
				continue
			}
			checked++
			p, anchor, _ := strings.Cut(target, "#")
			p, _, _ = strings.Cut(p, "?")
			if u, err := url.PathUnescape(p); err == nil {
				p = u
			}
			if strings.HasPrefix(p, "/") {
				t.Errorf("%s:%d: link %q is an absolute path; use a path relative to %s", name, l.line, target, path.Dir(name))
				continue
			}
			dest := path.Clean(path.Join(path.Dir(name), p))
			switch {
			case dest == ".." || strings.HasPrefix(dest, "../"):
				t.Errorf("%s:%d: link %q points outside the repository", name, l.line, target)
				continue
			case dest == ".":
				dest = ""
			}
			if !r.files[dest] && !r.dirs[dest] {
				t.Errorf("%s:%d: link %q: %s is not in the repository (missing, or ignored by git)", name, l.line, target, dest)
				continue
			}
			if anchor == "" || !r.files[dest] || !strings.EqualFold(path.Ext(dest), ".md") {
				continue
			}
			ids, ok := anchorCache[dest]
			if !ok {
				ids = anchors(r.read(t, dest))
				anchorCache[dest] = ids
			}
			if !ids[strings.ToLower(anchor)] {
				t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", name, l.line, target, dest, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link pattern is broken")
	}
	t.Logf("%d relative links in %d Markdown files", checked, len(md))
}

// outside are references a clone cannot follow: the design folder kept
// beside a checkout, and absolute paths of the machine the project was
// written on. They are built from parts so this file does not match them.
var outside = []struct {
	what string
	re   *regexp.Regexp
}{
	{"a path to the design folder outside the repository", regexp.MustCompile(regexp.QuoteMeta("../" + "shared/"))},
	{"an absolute path on the machine it was written on", regexp.MustCompile(`(^|[^\w.~/-])` + "/" + "work" + `($|[^\w.-])`)},
}

// TestNoReferenceOutsideTheRepository fails naming every file and line,
// in every text file of the repository, that refers to a path a clone
// does not have.
func TestNoReferenceOutsideTheRepository(t *testing.T) {
	r := loadRepo(t)
	for name := range r.files {
		b := r.read(t, name)
		if bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
			continue // binary
		}
		for i, l := range strings.Split(string(b), "\n") {
			for _, o := range outside {
				if loc := o.re.FindStringIndex(l); loc != nil {
					t.Errorf("%s:%d: %s: %q", name, i+1, o.what, strings.TrimSpace(l[max(0, loc[0]-20):min(len(l), loc[1]+30)]))
				}
			}
		}
	}
}

// citation matches "contract.md section 3", "contract.md sections 1, 4
// and 5" and "[contract.md](contract.md) section 3.2", across a line break
// in a Go comment.
var (
	citation   = regexp.MustCompile(`contract\.md(?:\]\(contract\.md\))?\)?[\s/]*sections?[\s/]+(\d+(?:\.\d+)?(?:(?:,[\s/]*|[\s/]+and[\s/]+)\d+(?:\.\d+)?)*)`)
	sectionNum = regexp.MustCompile(`\d+(?:\.\d+)?`)
	numbered   = regexp.MustCompile(`(?m)^#{2,3} (\d+(?:\.\d+)?)\.? `)
)

// TestContractCitationsExist fails naming every citation of a
// docs/contract.md section that the page does not have, so a renumbering
// cannot leave a comment pointing at nothing.
func TestContractCitationsExist(t *testing.T) {
	r := loadRepo(t)
	const contract = "docs/contract.md"
	if !r.files[contract] {
		t.Fatalf("%s is missing", contract)
	}
	sections := map[string]bool{}
	for _, m := range numbered.FindAllStringSubmatch(string(r.read(t, contract)), -1) {
		sections[m[1]] = true
	}
	if !sections["1"] || !sections["7"] {
		t.Fatalf("%s: sections 1 to 7 not found (have %v)", contract, sections)
	}
	found := 0
	for name := range r.files {
		ext := path.Ext(name)
		if ext != ".go" && ext != ".md" {
			continue
		}
		s := string(r.read(t, name))
		for _, m := range citation.FindAllStringSubmatchIndex(s, -1) {
			line := 1 + strings.Count(s[:m[0]], "\n")
			for _, n := range sectionNum.FindAllString(s[m[2]:m[3]], -1) {
				found++
				if !sections[n] {
					t.Errorf("%s:%d: cites %s section %s, which does not exist", name, line, contract, n)
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("no citations found: the citation pattern is broken")
	}
	t.Logf("%d citations of %s sections", found, contract)
}

// createTable matches the tables durallm's PostgreSQL schema creates.
var createTable = regexp.MustCompile(`CREATE TABLE (?:IF NOT EXISTS )?(\w+)`)

// TestDeployNamesEveryTableOfDurallmsDatabase fails naming each table of
// durallm's own database (internal/pgdb's migrations) that
// docs/deploy.md, where an operator grants and backs it up, leaves out.
func TestDeployNamesEveryTableOfDurallmsDatabase(t *testing.T) {
	r := loadRepo(t)
	deploy := string(r.read(t, "docs/deploy.md"))
	tables := createTable.FindAllStringSubmatch(string(r.read(t, "internal/pgdb/pgdb.go")), -1)
	if len(tables) == 0 {
		t.Fatal("no CREATE TABLE found in internal/pgdb/pgdb.go")
	}
	for _, m := range tables {
		if !strings.Contains(deploy, "`"+m[1]+"`") {
			t.Errorf("docs/deploy.md does not name table `%s` of durallm's database", m[1])
		}
	}
}
