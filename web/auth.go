package web

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// cookieName is the dashboard's session cookie.
const cookieName = "conveyor_session"

// principal is who a request runs as.
type principal struct {
	name string // "token #2", "user alice", "loopback-dev"
	role Role
}

// cred is one configured credential.
type cred struct {
	name   string
	role   Role
	secret [32]byte // SHA-256 of the token or password
	fp     string   // HMAC of the credential under the session key
}

// credentials are the configured tokens and users.
type credentials struct {
	key    []byte
	tokens []cred
	users  map[string]cred
	byFP   map[string]cred
	devLB  bool // InsecureLoopbackDev without credentials
}

func newCredentials(o Options) (*credentials, error) {
	c := &credentials{key: o.SessionKey, users: map[string]cred{}, byFP: map[string]cred{}}
	mac := func(parts ...string) string {
		m := hmac.New(sha256.New, o.SessionKey)
		for _, p := range parts {
			fmt.Fprintf(m, "%d:%s", len(p), p)
		}
		return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:18])
	}
	for i, t := range o.Tokens {
		switch {
		case len(t.Value) < 16:
			return nil, fmt.Errorf("web: token %d is shorter than 16 bytes", i+1)
		case !t.Role.valid():
			return nil, fmt.Errorf("web: token %d: role %q is neither %q nor %q", i+1, t.Role, RoleAdmin, RoleReadOnly)
		case strings.ContainsAny(t.Value, " \t\r\n"):
			return nil, fmt.Errorf("web: token %d contains white space", i+1)
		}
		cr := cred{name: fmt.Sprintf("token #%d", i+1), role: t.Role, secret: sha256.Sum256([]byte(t.Value)), fp: mac("token", t.Value)}
		c.tokens = append(c.tokens, cr)
		c.byFP[cr.fp] = cr
	}
	for _, u := range o.Users {
		switch {
		case u.Name == "" || strings.ContainsAny(u.Name, ":\r\n"):
			return nil, fmt.Errorf("web: user name %q is empty or contains ':' or a line break", u.Name)
		case len(u.Password) < 8:
			return nil, fmt.Errorf("web: user %q: password shorter than 8 bytes", u.Name)
		case !u.Role.valid():
			return nil, fmt.Errorf("web: user %q: role %q is neither %q nor %q", u.Name, u.Role, RoleAdmin, RoleReadOnly)
		}
		if _, dup := c.users[u.Name]; dup {
			return nil, fmt.Errorf("web: user %q given twice", u.Name)
		}
		cr := cred{name: "user " + u.Name, role: u.Role, secret: sha256.Sum256([]byte(u.Password)), fp: mac("user", u.Name, u.Password)}
		c.users[u.Name] = cr
		c.byFP[cr.fp] = cr
	}
	if len(c.tokens) == 0 && len(c.users) == 0 {
		if !o.InsecureLoopbackDev {
			return nil, errors.New("web: no credentials: set Options.Tokens or Options.Users (or, for development on loopback only, Options.InsecureLoopbackDev)")
		}
		c.devLB = true
	}
	return c, nil
}

// token returns the credential of a bearer token. Every token is compared,
// in constant time, so the time taken does not tell which one matched.
func (c *credentials) token(v string) (cred, bool) {
	sum := sha256.Sum256([]byte(v))
	var found cred
	ok := 0
	for _, t := range c.tokens {
		if subtle.ConstantTimeCompare(sum[:], t.secret[:]) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1
}

// user returns the credential of a user name and password.
func (c *credentials) user(name, password string) (cred, bool) {
	sum := sha256.Sum256([]byte(password))
	u, known := c.users[name]
	if !known {
		u.secret = sha256.Sum256([]byte("\x00no such user"))
	}
	match := subtle.ConstantTimeCompare(sum[:], u.secret[:]) == 1
	return u, known && match
}

// errForbiddenRemote is the refusal of a non-loopback request in
// InsecureLoopbackDev mode.
var errForbiddenRemote = errors.New("this server runs without authentication (InsecureLoopbackDev) and only answers loopback addresses")

// throttledError refuses the credentials of an address that failed to
// log in too often (see loginThrottle).
type throttledError struct{ wait time.Duration }

func (e throttledError) Error() string {
	return fmt.Sprintf("too many failed logins from this address: try again in %d s", retryAfter(e.wait))
}

// authenticate returns the request's principal. A request that carries
// an Authorization header is judged by it alone (unless its address is
// throttled, see loginThrottle); otherwise by its session cookie.
func (h *Handler) authenticate(r *http.Request) (principal, error) {
	c := h.creds
	if c.devLB {
		if !isLoopback(r.RemoteAddr) {
			return principal{}, errForbiddenRemote
		}
		return principal{name: "loopback-dev", role: RoleAdmin}, nil
	}
	if a := r.Header.Get("Authorization"); a != "" {
		if d := h.throttle.wait(r.RemoteAddr); d > 0 {
			return principal{}, throttledError{d}
		}
		if v, ok := strings.CutPrefix(a, "Bearer "); ok {
			if cr, ok := c.token(strings.TrimSpace(v)); ok {
				return principal{name: cr.name, role: cr.role}, nil
			}
			h.throttle.fail(r.Context(), h.opts.Logger, r.RemoteAddr, "bearer", "")
			return principal{}, errors.New("unknown bearer token")
		}
		if name, pw, ok := r.BasicAuth(); ok {
			if cr, ok := c.user(name, pw); ok {
				return principal{name: cr.name, role: cr.role}, nil
			}
			h.throttle.fail(r.Context(), h.opts.Logger, r.RemoteAddr, "basic", name)
			return principal{}, errors.New("wrong user name or password")
		}
		return principal{}, errors.New("unsupported Authorization scheme (use Bearer or Basic)")
	}
	if ck, err := r.Cookie(cookieName); err == nil {
		if cr, ok := h.session(ck.Value); ok {
			return principal{name: cr.name, role: cr.role}, nil
		}
		return principal{}, errors.New("session expired, logged out or no longer valid: log in again")
	}
	return principal{}, errors.New("authentication required")
}

// Bounds of the session table.
const (
	// maxSessionsPerCred is the most open sessions of one credential;
	// a login beyond it ends that credential's oldest session.
	maxSessionsPerCred = 100
)

// sessions are the dashboard's logins, kept in the handler's memory: a
// session is a random id in the cookie (signed with the session key) and
// an entry here, so that logging out ends it on the server and the old
// cookie is refused from then on. A session is valid only on the handler
// that opened it. Entries end at their expiry, at logout, or when their
// credential's sessions go over maxSessionsPerCred (the oldest first); so
// the table holds at most that many per configured credential.
type sessions struct {
	mu   sync.Mutex
	now  func() time.Time
	byID map[string]*sessionEntry
}

// sessionEntry is one open session.
type sessionEntry struct {
	fp      string // the credential's fingerprint
	created time.Time
	exp     time.Time
}

func newSessions() *sessions {
	return &sessions{now: time.Now, byID: map[string]*sessionEntry{}}
}

// open records a new session of fp lasting ttl and returns its id.
func (s *sessions) open(fp string, ttl time.Duration) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	id := base64.RawURLEncoding.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var oldest string
	n := 0
	for k, e := range s.byID {
		switch {
		case !now.Before(e.exp):
			delete(s.byID, k)
		case e.fp == fp:
			n++
			if oldest == "" || e.created.Before(s.byID[oldest].created) {
				oldest = k
			}
		}
	}
	if n >= maxSessionsPerCred {
		delete(s.byID, oldest)
	}
	s.byID[id] = &sessionEntry{fp: fp, created: now, exp: now.Add(ttl)}
	return id
}

// get returns the fingerprint of an open, unexpired session.
func (s *sessions) get(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if !ok {
		return "", false
	}
	if !s.now().Before(e.exp) {
		delete(s.byID, id)
		return "", false
	}
	return e.fp, true
}

// end ends a session.
func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

// newSession opens a session for cr and returns its cookie value: the
// session's id and its signature.
func (h *Handler) newSession(cr cred) string {
	id := h.sessions.open(cr.fp, h.opts.SessionTTL)
	return id + "." + h.sign(id)
}

func (h *Handler) sign(payload string) string {
	m := hmac.New(sha256.New, h.creds.key)
	m.Write([]byte("session:" + payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sessionID returns the id of a cookie value whose signature is valid.
func (h *Handler) sessionID(v string) (string, bool) {
	id, sig, ok := strings.Cut(v, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(h.sign(id))) {
		return "", false
	}
	return id, true
}

// session returns the credential of an open, unexpired session whose
// credential is still configured.
func (h *Handler) session(v string) (cred, bool) {
	id, ok := h.sessionID(v)
	if !ok {
		return cred{}, false
	}
	fp, ok := h.sessions.get(id)
	if !ok {
		return cred{}, false
	}
	cr, ok := h.creds.byFP[fp]
	return cr, ok
}

// reqInfo is filled in as a request goes through the handler, for the
// access log.
type reqInfo struct{ who string }

type reqInfoKey struct{}

// guard authenticates and authorises a route before running it.
func (h *Handler) guard(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt.public {
			rt.fn(w, r, principal{})
			return
		}
		p, err := h.authenticate(r)
		if err != nil {
			if errors.Is(err, errForbiddenRemote) {
				writeError(w, http.StatusForbidden, err.Error())
				return
			}
			var te throttledError
			if errors.As(err, &te) {
				h.throttled(w, r, rt.html, te)
				return
			}
			h.unauthorized(w, r, rt, err)
			return
		}
		if ri, ok := r.Context().Value(reqInfoKey{}).(*reqInfo); ok {
			ri.who = p.name
		}
		if rt.role == RoleAdmin && p.role != RoleAdmin {
			if rt.html {
				h.renderError(w, r, p, http.StatusForbidden, "your role is read-only: this action needs an admin credential")
				return
			}
			writeError(w, http.StatusForbidden, "read-only credential: this action needs the admin role")
			return
		}
		rt.fn(w, r, p)
	})
}

// unauthorized answers a request without valid credentials: the login
// page for the dashboard, a JSON 401 for the API.
func (h *Handler) unauthorized(w http.ResponseWriter, r *http.Request, rt route, err error) {
	if rt.html && !strings.HasPrefix(r.URL.Path, h.opts.BasePath+"/api/") {
		next := ""
		if r.Method == http.MethodGet {
			next = r.URL.RequestURI()
		}
		msg := ""
		if r.Header.Get("Authorization") != "" || hasCookie(r) {
			msg = err.Error()
		}
		h.renderLogin(w, http.StatusUnauthorized, next, msg)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="conveyor"`)
	writeError(w, http.StatusUnauthorized, err.Error())
}

func hasCookie(r *http.Request) bool {
	_, err := r.Cookie(cookieName)
	return err == nil
}

// throttled answers a request whose address must wait before its
// credentials are looked at: 429 with Retry-After, the login form for the
// dashboard, JSON for the API.
func (h *Handler) throttled(w http.ResponseWriter, r *http.Request, html bool, te throttledError) {
	w.Header().Set("Retry-After", fmt.Sprint(retryAfter(te.wait)))
	if html && !strings.HasPrefix(r.URL.Path, h.opts.BasePath+"/api/") {
		h.renderLogin(w, http.StatusTooManyRequests, "", te.Error())
		return
	}
	writeError(w, http.StatusTooManyRequests, te.Error())
}

// safeNext returns next when it is a clean path under the base path (with
// an optional query), else the dashboard's home, so that the login cannot
// redirect to another origin or out of the handler. Refused: anything but
// printable ASCII (browsers drop tabs and line breaks, so "/\t/host"
// would become "//host"), backslashes, fragments, "//" and "." or ".."
// segments (also percent-encoded), paths outside the base, and the login
// page itself.
func (h *Handler) safeNext(next string) string {
	home := h.opts.BasePath + "/"
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c >= 0x7f || c == '\\' || c == '#' {
			return home
		}
	}
	p, _, _ := strings.Cut(next, "?")
	dec, err := url.PathUnescape(p)
	if err != nil || !strings.HasPrefix(p, home) || !strings.HasPrefix(dec, home) || strings.HasPrefix(dec, h.opts.BasePath+"/login") {
		return home
	}
	for i := 0; i < len(dec); i++ {
		if c := dec[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return home
		}
	}
	for _, seg := range strings.Split(dec[len(home):], "/") {
		if seg == "." || seg == ".." {
			return home
		}
	}
	if strings.Contains(dec, "//") {
		return home
	}
	return next
}

// loginPage shows the login form (GET /login).
func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request, _ principal) {
	h.renderLogin(w, http.StatusOK, r.URL.Query().Get("next"), "")
}

// login checks a token or a user name and password from the login form
// and sets the session cookie (POST /login). Failures are throttled and
// logged by address (see loginThrottle).
func (h *Handler) login(w http.ResponseWriter, r *http.Request, _ principal) {
	if err := r.ParseForm(); err != nil {
		h.renderLogin(w, bodyStatus(err), "", "could not read the form: "+err.Error())
		return
	}
	next := r.PostForm.Get("next")
	var cr cred
	ok := false
	if h.creds.devLB {
		h.renderLogin(w, http.StatusBadRequest, next, "this server runs without authentication: no login needed")
		return
	}
	if d := h.throttle.wait(r.RemoteAddr); d > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(retryAfter(d)))
		h.renderLogin(w, http.StatusTooManyRequests, next, throttledError{d}.Error())
		return
	}
	user := r.PostForm.Get("user")
	if tok := strings.TrimSpace(r.PostForm.Get("token")); tok != "" {
		cr, ok = h.creds.token(tok)
		user = ""
	} else if user != "" {
		cr, ok = h.creds.user(user, r.PostForm.Get("password"))
	}
	if !ok {
		h.throttle.fail(r.Context(), h.opts.Logger, r.RemoteAddr, "login form", user)
		h.renderLogin(w, http.StatusUnauthorized, next, "wrong token, user name or password")
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: h.newSession(cr), Path: h.opts.BasePath + "/",
		MaxAge: int(h.opts.SessionTTL.Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil || h.opts.SecureCookie,
	})
	http.Redirect(w, r, h.safeNext(next), http.StatusSeeOther)
}

// logout ends the request's session on the server, so that its cookie is
// refused from then on, and clears the cookie (POST /logout).
func (h *Handler) logout(w http.ResponseWriter, r *http.Request, _ principal) {
	if ck, err := r.Cookie(cookieName); err == nil {
		if id, ok := h.sessionID(ck.Value); ok {
			h.sessions.end(id)
		}
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: h.opts.BasePath + "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || h.opts.SecureCookie,
	})
	http.Redirect(w, r, h.opts.BasePath+"/login", http.StatusSeeOther)
}

// withReqInfo adds a reqInfo to the request's context.
func withReqInfo(r *http.Request) (*http.Request, *reqInfo) {
	ri := &reqInfo{}
	return r.WithContext(context.WithValue(r.Context(), reqInfoKey{}, ri)), ri
}
