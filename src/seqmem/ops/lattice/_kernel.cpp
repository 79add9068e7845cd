// Fused CPU kernel for the exact Lattice / OSR scan (seqmem.ops.lattice.scan, mode="scan").
// Plain C++ (no torch headers), built on first use by seqmem.ops.lattice._cpp and called through ctypes.
//
// Layout (contiguous): S0 (N,d,m) row-major with slots = columns; q,k,g (N,T,m); v (N,T,d); mu (N,T) or null;
// y (N,T,d); bounds (N,nc,d,m) = the state at the start of every chunk of `chunk` tokens.
// obj: 0 = dec, 1 = enc, 2 = sim  (with the unit-sphere projection, eq. 14);  3 = delta (eq. 20, no projection);
//      4 = ttt (eq. 19, no projection);  5, 6, 7 = dec, enc, sim WITHOUT the projection (plain OSR, eq. 13:
//      phi divides by the actual column norms).
// The math is the hand-derived VJP documented in scan.py (_fwd_chunk / _bwd_chunk), one head at a time.
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

template <typename F>
struct Saved {
  std::vector<F> h, p, w, b, rho;  // per step of a chunk: h (d), p/w/b/rho (m)
};

// One forward step: S_in (d,m) -> S_out (d,m). Writes h, p, w, b, rho at the given pointers (may be scratch).
// S' = mu S - h w^T with w = g * k (the ttt and delta updates)
template <typename F>
inline void decay_rank1(int64_t d, int64_t m, const F* S, F* So, const F* g, const F* k, const F* h, F* w, F mu) {
  for (int64_t i = 0; i < m; ++i) w[i] = g[i] * k[i];
  for (int64_t a = 0; a < d; ++a) {
    const F* Sa = S + a * m;
    F* Oa = So + a * m;
    for (int64_t i = 0; i < m; ++i) Oa[i] = mu * Sa[i] - h[a] * w[i];
  }
}

template <typename F>
inline void step_fwd(int obj, int64_t d, int64_t m, const F* S, F* So, const F* k, const F* v, const F* g, F mu,
                     F* h, F* p, F* w, F* b, F* rho) {
  if (obj == 4) {  // ttt: z = S k, vh = z/|z|, e = vh - v, pe = (e - vh <vh,e>)/|z|; S' = mu S - pe (g k)^T
    // scratch: h <- pe (d), p[0..1] <- (|z|, <vh,e>) when m >= 2, else b/rho; vh and e are recomputed in bwd
    F nz = 0;
    for (int64_t a = 0; a < d; ++a) {
      F acc = 0;
      const F* Sa = S + a * m;
      for (int64_t i = 0; i < m; ++i) acc += Sa[i] * k[i];
      h[a] = acc;  // z
      nz += acc * acc;
    }
    nz = std::sqrt(nz);
    if (nz < F(1e-12)) nz = F(1e-12);
    F c = 0;
    for (int64_t a = 0; a < d; ++a) c += (h[a] / nz) * (h[a] / nz - v[a]);
    for (int64_t a = 0; a < d; ++a) {
      F vh = h[a] / nz;
      h[a] = ((vh - v[a]) - vh * c) / nz;  // pe
    }
    b[0] = nz;
    rho[0] = c;
    decay_rank1<F>(d, m, S, So, g, k, h, w, mu);
    return;
  }
  if (obj >= 5) {  // plain OSR: r = 1/|s_i|, Sb = S diag(r); rho <- r, b <- mu + a r
    const int o2 = obj - 5;  // 0 dec, 1 enc, 2 sim
    for (int64_t i = 0; i < m; ++i) rho[i] = 0;
    for (int64_t a = 0; a < d; ++a)
      for (int64_t i = 0; i < m; ++i) rho[i] += S[a * m + i] * S[a * m + i];
    for (int64_t i = 0; i < m; ++i) {  // an empty slot (|s_i| < 1e-12): r = 0, it reads nothing and takes no step
      const F nrm = std::sqrt(rho[i]);
      rho[i] = nrm < F(1e-12) ? F(0) : F(1) / nrm;
    }
    for (int64_t a = 0; a < d; ++a) {
      if (o2 == 0) {
        F acc = 0;
        for (int64_t i = 0; i < m; ++i) acc += S[a * m + i] * rho[i] * k[i];
        h[a] = acc - v[a];
      } else {
        h[a] = (o2 == 1) ? v[a] : -v[a];
      }
    }
    for (int64_t i = 0; i < m; ++i) p[i] = 0;
    for (int64_t a = 0; a < d; ++a)
      for (int64_t i = 0; i < m; ++i) p[i] += S[a * m + i] * h[a];
    for (int64_t i = 0; i < m; ++i) {
      p[i] *= rho[i];
      const F c = (o2 == 1) ? p[i] - k[i] : k[i];
      w[i] = g[i] * c * rho[i];
      b[i] = mu + p[i] * w[i] * rho[i];
    }
    for (int64_t a = 0; a < d; ++a)
      for (int64_t i = 0; i < m; ++i) So[a * m + i] = S[a * m + i] * b[i] - h[a] * w[i];
    return;
  }
  if (obj == 0 || obj == 3) {  // h = S k - v
    for (int64_t a = 0; a < d; ++a) {
      F acc = 0;
      const F* Sa = S + a * m;
      for (int64_t i = 0; i < m; ++i) acc += Sa[i] * k[i];
      h[a] = acc - v[a];
    }
  } else if (obj == 1) {
    for (int64_t a = 0; a < d; ++a) h[a] = v[a];
  } else {
    for (int64_t a = 0; a < d; ++a) h[a] = -v[a];
  }
  if (obj == 3) {  // delta: S' = mu S - h (g k)^T
    decay_rank1<F>(d, m, S, So, g, k, h, w, mu);
    return;
  }
  for (int64_t i = 0; i < m; ++i) p[i] = 0;
  for (int64_t a = 0; a < d; ++a) {
    const F* Sa = S + a * m;
    for (int64_t i = 0; i < m; ++i) p[i] += Sa[i] * h[a];
  }
  for (int64_t i = 0; i < m; ++i) {
    w[i] = (obj == 1) ? g[i] * (p[i] - k[i]) : g[i] * k[i];
    b[i] = mu + p[i] * w[i];
    rho[i] = 0;
  }
  for (int64_t a = 0; a < d; ++a) {
    const F* Sa = S + a * m;
    F* Oa = So + a * m;
    for (int64_t i = 0; i < m; ++i) {
      F u = Sa[i] * b[i] - h[a] * w[i];
      Oa[i] = u;
      rho[i] += u * u;
    }
  }
  for (int64_t i = 0; i < m; ++i) rho[i] = std::sqrt(rho[i]);
  for (int64_t a = 0; a < d; ++a) {
    F* Oa = So + a * m;
    for (int64_t i = 0; i < m; ++i) Oa[i] /= rho[i];
  }
}

template <typename F>
inline void readout(int64_t d, int64_t m, const F* S, const F* q, F* y) {
  for (int64_t a = 0; a < d; ++a) {
    F acc = 0;
    const F* Sa = S + a * m;
    for (int64_t i = 0; i < m; ++i) acc += Sa[i] * q[i];
    y[a] = acc;
  }
}

template <typename F>
void fwd(int obj, int64_t N, int64_t T, int64_t d, int64_t m, int64_t chunk, const F* S0, const F* q, const F* k,
         const F* v, const F* g, const F* mu, F* y, F* bounds, F* Send) {
  const int64_t nc = (T + chunk - 1) / chunk, dm = d * m;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<F> S(S0 + n * dm, S0 + (n + 1) * dm), So(dm), h(d), p(m), w(m), b(m), rho(m);
    for (int64_t t = 0; t < T; ++t) {
      if (t % chunk == 0) {
        F* bd = bounds + (n * nc + t / chunk) * dm;
        for (int64_t j = 0; j < dm; ++j) bd[j] = S[j];
      }
      const int64_t o = n * T + t;
      step_fwd<F>(obj, d, m, S.data(), So.data(), k + o * m, v + o * d, g + o * m, mu ? mu[o] : F(1), h.data(),
                  p.data(), w.data(), b.data(), rho.data());
      S.swap(So);
      readout<F>(d, m, S.data(), q + o * m, y + o * d);
    }
    for (int64_t j = 0; j < dm; ++j) Send[n * dm + j] = S[j];
  }
}

// The backward of the OSR update's -h w^T term and of the slots' overlap with X (X = the state's cotangent G, or gU
// after the sphere projection): xs_i = sum_a X[a,i] S[a,i], gw_i = -sum_a X[a,i] h_a, gh_a = -sum_i X[a,i] w_i.
template <typename F>
inline void osr_back(int64_t d, int64_t m, const F* X, const F* S, const F* h, const F* w, F* xs, F* gw, F* gh) {
  for (int64_t i = 0; i < m; ++i) {
    xs[i] = 0;
    gw[i] = 0;
  }
  for (int64_t a = 0; a < d; ++a) {
    const F* Xa = X + a * m;
    const F* Sa = S + a * m;
    F acc = 0;
    for (int64_t i = 0; i < m; ++i) {
      xs[i] += Xa[i] * Sa[i];
      gw[i] -= Xa[i] * h[a];
      acc += Xa[i] * w[i];
    }
    gh[a] = -acc;
  }
}

template <typename F>
void bwd(int obj, int64_t N, int64_t T, int64_t d, int64_t m, int64_t chunk, const F* bounds, const F* q,
         const F* k, const F* v, const F* g, const F* mu, const F* gy, const F* gSend, F* gS0, F* gq, F* gk, F* gv,
         F* gg, F* gmu) {
  const int64_t nc = (T + chunk - 1) / chunk, dm = d * m;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<F> states((chunk + 1) * dm), G(gSend + n * dm, gSend + (n + 1) * dm), gU(dm);
    std::vector<F> H(chunk * d), P(chunk * m), W(chunk * m), Bv(chunk * m), R(chunk * m);
    std::vector<F> gh(d), ga(m), gw(m), gp(m);
    for (int64_t c = nc - 1; c >= 0; --c) {
      const int64_t t0 = c * chunk, t1 = (t0 + chunk < T) ? t0 + chunk : T, C = t1 - t0;
      const F* bd = bounds + (n * nc + c) * dm;
      for (int64_t j = 0; j < dm; ++j) states[j] = bd[j];
      for (int64_t s = 0; s < C; ++s) {  // recompute the chunk
        const int64_t o = n * T + t0 + s;
        step_fwd<F>(obj, d, m, &states[s * dm], &states[(s + 1) * dm], k + o * m, v + o * d, g + o * m,
                    mu ? mu[o] : F(1), &H[s * d], &P[s * m], &W[s * m], &Bv[s * m], &R[s * m]);
      }
      for (int64_t s = C - 1; s >= 0; --s) {
        const int64_t o = n * T + t0 + s;
        const F* Si = &states[s * dm];
        const F* So = &states[(s + 1) * dm];
        const F *qt = q + o * m, *kt = k + o * m, *gt = g + o * m, *gyt = gy + o * d;
        const F* h = &H[s * d];
        const F* w = &W[s * m];
        const F mut = mu ? mu[o] : F(1);
        // read-out y_t = S_t q_t
        for (int64_t i = 0; i < m; ++i) gq[o * m + i] = 0;
        for (int64_t a = 0; a < d; ++a) {
          const F* Sa = So + a * m;
          F* Ga = &G[a * m];
          for (int64_t i = 0; i < m; ++i) {
            gq[o * m + i] += Sa[i] * gyt[a];
            Ga[i] += gyt[a] * qt[i];
          }
        }
        if (obj >= 5) {  // plain OSR (no projection)
          const int o2 = obj - 5;
          const F* p = &P[s * m];
          const F* b = &Bv[s * m];
          const F* r = &R[s * m];
          std::vector<F>& gb = ga;  // g_b, then reused
          std::vector<F> gr(m), gc(m), sh(m);
          F gm = 0;
          osr_back<F>(d, m, G.data(), Si, h, w, gb.data(), gw.data(), gh.data());
          for (int64_t i = 0; i < m; ++i) {
            gm += gb[i];
            const F ai = p[i] * w[i];
            const F gai = gb[i] * r[i];
            gr[i] = gb[i] * ai;
            gw[i] += gai * p[i];
            gp[i] = gai * w[i];
            const F c = (o2 == 1) ? p[i] - kt[i] : kt[i];
            gg[o * m + i] = gw[i] * c * r[i];
            gc[i] = gw[i] * gt[i] * r[i];
            gr[i] += gw[i] * gt[i] * c;
            sh[i] = r[i] > F(0) ? p[i] / r[i] : F(0);  // (S^T h)_i (0 for an empty slot)
            gr[i] += gp[i] * sh[i];  // p = Sb^T h
            if (o2 == 1) gr[i] += gc[i] * sh[i];  // enc: c = Sb^T v - k, h = v
          }
          for (int64_t a = 0; a < d; ++a) {  // g_h += Sb g_p
            const F* Sa = Si + a * m;
            F acc = 0;
            for (int64_t i = 0; i < m; ++i) acc += Sa[i] * r[i] * gp[i];
            gh[a] += acc;
          }
          if (o2 == 0) {  // dec: h = Sb k - v
            for (int64_t i = 0; i < m; ++i) sh[i] = 0;  // (S^T g_h)_i
            for (int64_t a = 0; a < d; ++a)
              for (int64_t i = 0; i < m; ++i) sh[i] += Si[a * m + i] * gh[a];
            for (int64_t i = 0; i < m; ++i) {
              gk[o * m + i] = r[i] * sh[i] + gc[i];
              gr[i] += kt[i] * sh[i];
            }
            for (int64_t a = 0; a < d; ++a) gv[o * d + a] = -gh[a];
          } else if (o2 == 1) {  // enc
            for (int64_t i = 0; i < m; ++i) gk[o * m + i] = -gc[i];
            for (int64_t a = 0; a < d; ++a) {
              const F* Sa = Si + a * m;
              F acc = 0;
              for (int64_t i = 0; i < m; ++i) acc += Sa[i] * r[i] * gc[i];
              gv[o * d + a] = gh[a] + acc;
            }
          } else {  // sim
            for (int64_t i = 0; i < m; ++i) gk[o * m + i] = gc[i];
            for (int64_t a = 0; a < d; ++a) gv[o * d + a] = -gh[a];
          }
          for (int64_t a = 0; a < d; ++a) {
            F* Ga = &G[a * m];
            const F* Sa = Si + a * m;
            const F va = v[o * d + a];
            for (int64_t i = 0; i < m; ++i) {
              F gsb = h[a] * gp[i];
              if (o2 == 0) gsb += gh[a] * kt[i];
              if (o2 == 1) gsb += va * gc[i];
              Ga[i] = Ga[i] * b[i] + r[i] * gsb - gr[i] * r[i] * r[i] * r[i] * Sa[i];
            }
          }
          if (gmu) gmu[o] = gm;
          continue;
        }
        if (obj == 4) {  // ttt (eq. 19): h = pe, nz = Bv[s*m], c = R[s*m]
          const F nz = Bv[s * m], c = R[s * m];
          std::vector<F>& zb = gU;  // scratch (d) for z, then g_z
          F gm = 0;
          for (int64_t i = 0; i < m; ++i) gw[i] = 0;
          for (int64_t a = 0; a < d; ++a) {
            const F* Ga = &G[a * m];
            const F* Sa = Si + a * m;
            F acc = 0, zz = 0;
            for (int64_t i = 0; i < m; ++i) {
              acc += Ga[i] * w[i];
              gw[i] -= Ga[i] * h[a];
              gm += Ga[i] * Sa[i];
              zz += Sa[i] * kt[i];
            }
            gh[a] = -acc;  // g_pe
            zb[a] = zz;    // z
          }
          // pe = (e - vh c)/nz, c = <vh, e>, e = vh - v, vh = z/nz
          F gc = 0, gnz = 0;
          for (int64_t a = 0; a < d; ++a) {
            gc -= (zb[a] / nz) * gh[a] / nz;
            gnz -= h[a] * gh[a] / nz;
          }
          F vh_gvh = 0;
          for (int64_t a = 0; a < d; ++a) {
            const F vh = zb[a] / nz, e = vh - v[o * d + a];
            F ge = gh[a] / nz + gc * vh;             // from pe and from c
            F gvh = -(gh[a] / nz) * c + gc * e + ge;  // from pe, from c, from e
            gv[o * d + a] = -ge;
            vh_gvh += vh * gvh;
            zb[a] = gvh;  // temporarily g_vh
          }
          gnz -= vh_gvh / nz;
          for (int64_t a = 0; a < d; ++a) {
            // g_z = g_vh / nz + g_nz * vh   (vh recomputed from pe? use z = S k again via Si)
            F zz = 0;
            const F* Sa = Si + a * m;
            for (int64_t i = 0; i < m; ++i) zz += Sa[i] * kt[i];
            zb[a] = zb[a] / nz + gnz * (zz / nz);
          }
          for (int64_t i = 0; i < m; ++i) gk[o * m + i] = gw[i] * gt[i];
          for (int64_t a = 0; a < d; ++a) {
            F* Ga = &G[a * m];
            const F* Sa = Si + a * m;
            for (int64_t i = 0; i < m; ++i) {
              Ga[i] = mut * Ga[i] + zb[a] * kt[i];
              gk[o * m + i] += Sa[i] * zb[a];
            }
          }
          for (int64_t i = 0; i < m; ++i) gg[o * m + i] = gw[i] * kt[i];
          if (gmu) gmu[o] = gm;
          continue;
        }
        if (obj == 3) {  // delta
          F gm = 0;
          for (int64_t i = 0; i < m; ++i) gw[i] = 0;
          for (int64_t a = 0; a < d; ++a) {
            const F* Ga = &G[a * m];
            const F* Sa = Si + a * m;
            F acc = 0;
            for (int64_t i = 0; i < m; ++i) {
              acc += Ga[i] * w[i];
              gw[i] -= Ga[i] * h[a];
              gm += Ga[i] * Sa[i];
            }
            gh[a] = -acc;
          }
          for (int64_t i = 0; i < m; ++i) gk[o * m + i] = gw[i] * gt[i];
          for (int64_t a = 0; a < d; ++a) {
            F* Ga = &G[a * m];
            const F* Sa = Si + a * m;
            for (int64_t i = 0; i < m; ++i) {
              Ga[i] = mut * Ga[i] + gh[a] * kt[i];
              gk[o * m + i] += Sa[i] * gh[a];
            }
            gv[o * d + a] = -gh[a];
          }
          for (int64_t i = 0; i < m; ++i) gg[o * m + i] = gw[i] * kt[i];
          if (gmu) gmu[o] = gm;
          continue;
        }
        const F* p = &P[s * m];
        const F* b = &Bv[s * m];
        const F* rho = &R[s * m];
        // gU = (G - S_out <G, S_out>_col) / rho
        for (int64_t i = 0; i < m; ++i) ga[i] = 0;  // temporarily: <G, S_out>
        for (int64_t a = 0; a < d; ++a)
          for (int64_t i = 0; i < m; ++i) ga[i] += G[a * m + i] * So[a * m + i];
        for (int64_t a = 0; a < d; ++a)
          for (int64_t i = 0; i < m; ++i) gU[a * m + i] = (G[a * m + i] - So[a * m + i] * ga[i]) / rho[i];
        osr_back<F>(d, m, gU.data(), Si, h, w, ga.data(), gw.data(), gh.data());
        F gm = 0;
        for (int64_t i = 0; i < m; ++i) {
          gw[i] += ga[i] * p[i];
          gp[i] = ga[i] * w[i];
          if (obj == 1) gp[i] += gw[i] * gt[i];
          gm += ga[i];
        }
        for (int64_t a = 0; a < d; ++a) {
          F* Ga = &G[a * m];
          const F* Ua = &gU[a * m];
          const F* Sa = Si + a * m;
          F acc = 0;
          for (int64_t i = 0; i < m; ++i) {
            Ga[i] = Ua[i] * b[i] + h[a] * gp[i];
            acc += Sa[i] * gp[i];
          }
          gh[a] += acc;
        }
        if (obj == 0) {  // h = S k - v
          for (int64_t i = 0; i < m; ++i) gk[o * m + i] = gw[i] * gt[i];
          for (int64_t a = 0; a < d; ++a) {
            F* Ga = &G[a * m];
            const F* Sa = Si + a * m;
            for (int64_t i = 0; i < m; ++i) {
              Ga[i] += gh[a] * kt[i];
              gk[o * m + i] += Sa[i] * gh[a];
            }
            gv[o * d + a] = -gh[a];
          }
          for (int64_t i = 0; i < m; ++i) gg[o * m + i] = gw[i] * kt[i];
        } else if (obj == 2) {  // sim: h = -v
          for (int64_t i = 0; i < m; ++i) {
            gk[o * m + i] = gw[i] * gt[i];
            gg[o * m + i] = gw[i] * kt[i];
          }
          for (int64_t a = 0; a < d; ++a) gv[o * d + a] = -gh[a];
        } else {  // enc: h = v, w = g (p - k)
          for (int64_t i = 0; i < m; ++i) {
            gk[o * m + i] = -gw[i] * gt[i];
            gg[o * m + i] = gw[i] * (p[i] - kt[i]);
          }
          for (int64_t a = 0; a < d; ++a) gv[o * d + a] = gh[a];
        }
        if (gmu) gmu[o] = gm;
      }
    }
    for (int64_t j = 0; j < dm; ++j) gS0[n * dm + j] = G[j];
  }
}

}  // namespace

extern "C" {
void lattice_fwd_f64(int obj, int64_t N, int64_t T, int64_t d, int64_t m, int64_t chunk, const double* S0,
                     const double* q, const double* k, const double* v, const double* g, const double* mu, double* y,
                     double* bounds, double* Send) {
  fwd<double>(obj, N, T, d, m, chunk, S0, q, k, v, g, mu, y, bounds, Send);
}
void lattice_fwd_f32(int obj, int64_t N, int64_t T, int64_t d, int64_t m, int64_t chunk, const float* S0,
                     const float* q, const float* k, const float* v, const float* g, const float* mu, float* y,
                     float* bounds, float* Send) {
  fwd<float>(obj, N, T, d, m, chunk, S0, q, k, v, g, mu, y, bounds, Send);
}
void lattice_bwd_f64(int obj, int64_t N, int64_t T, int64_t d, int64_t m, int64_t chunk, const double* bounds,
                     const double* q, const double* k, const double* v, const double* g, const double* mu,
                     const double* gy, const double* gSend, double* gS0, double* gq, double* gk, double* gv,
                     double* gg, double* gmu) {
  bwd<double>(obj, N, T, d, m, chunk, bounds, q, k, v, g, mu, gy, gSend, gS0, gq, gk, gv, gg, gmu);
}
void lattice_bwd_f32(int obj, int64_t N, int64_t T, int64_t d, int64_t m, int64_t chunk, const float* bounds,
                     const float* q, const float* k, const float* v, const float* g, const float* mu,
                     const float* gy, const float* gSend, float* gS0, float* gq, float* gk, float* gv, float* gg,
                     float* gmu) {
  bwd<float>(obj, N, T, d, m, chunk, bounds, q, k, v, g, mu, gy, gSend, gS0, gq, gk, gv, gg, gmu);
}
}
