"""The mean-field limit: the Transformer PDE for the token density, the uniform state's linear
stability, and the distance from N particles to the PDE.

* :mod:`attnflow.pde.basis`: Fourier and real spherical-harmonic bases on their quadrature grids;
* :mod:`attnflow.pde.solver`: :func:`~attnflow.pde.solver.solve_pde`, the Galerkin RK4 solver of
  ``d/dt rho + div_S(rho v_t[rho]) = 0`` on ``S^1`` and ``S^2``;
* :mod:`attnflow.pde.growth`: :func:`~attnflow.pde.growth.linear_growth_rates` and their measurement;
* :mod:`attnflow.pde.meanfield`: ``W_2`` and MMD between particle runs and the PDE over ``N``;
* :mod:`attnflow.pde.config`, :mod:`attnflow.pde.output`: the ``attnflow pde`` config and folder.

This layer sits above :mod:`attnflow.solve` (it runs particles to compare with) and below
:mod:`attnflow.viz`; it draws its own figures with matplotlib, loaded only when used.
"""
